"""Token embedding and the LM head that turns the last hidden state into next-token logits."""

import torch
from torch import nn

from minillm.layers.linear import copy_checked
from minillm.utils.parallel import TensorParallelGroup, all_reduce, divide, get_tp_group, get_tp_rank, get_tp_size


def embed(input_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row lookup: token id t becomes row t of the table (the same as one_hot(t) @ weight, without the matmul).

    Inputs: `input_ids`, an integer tensor of any shape (a 0-d single id, [n] for a sequence, [b, n] for a
    batch), every id in 0..vocab-1; `weight`, the embedding table, [vocab, hidden], of any float dtype.
    Output: a tensor of shape input_ids.shape + (hidden,) whose entry [..., :] for id t is row t of `weight`,
    in the table's own dtype (a bfloat16 table gives bfloat16 rows, exactly equal to the table's). A repeated
    id gives the same row each time. Nothing is updated: no state, no copy of the table.

    The tests compare with the slow formula one_hot(ids, vocab).float() @ weight and with F.embedding, for
    one id, a sequence and a 2-D batch; check the dtype on a bfloat16 table; and run the story model with
    your function plugged in (same logits, same greedy tokens).

    Example: with weight = [[0., 1.], [2., 3.], [4., 5.]] (vocab 3, hidden 2), ids [2, 0, 2] give
    [[4., 5.], [0., 1.], [4., 5.]] (shape [3, 2]), and the single id tensor(1) gives [2., 3.] (shape [2]).
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 02.1: embedding lookup — token id t becomes row t of the table, for ids of any shape
    return weight[input_ids]
    # END EXERCISE


def lm_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Score every vocabulary entry: one logit per token id, the dot product of `hidden` with that token's row.

    Inputs: `hidden`, a float tensor [..., hidden_size] (one vector, [hidden_size]; a sequence, [n,
    hidden_size]; a batch, [b, n, hidden_size]); `weight`, the (tied) table [vocab, hidden_size]. Output:
    logits of shape [..., vocab]: hidden's leading dimensions stay and the last becomes the vocabulary, with
    logits[..., t] = sum over j of hidden[..., j] * weight[t, j]. This is hidden @ weightᵀ, the same product as
    F.linear(hidden, weight) without a bias. Nothing is updated.

    The tests compare with F.linear for one vector, a sequence and a 2-D batch; with an orthonormal table,
    embedding ids and scoring them must give their one-hot rows (each row scores 1 against itself, 0 against
    the others); and the story model with your function plugged in must give the same logits and greedy tokens.

    Example: weight = [[1., 0.], [0., 1.], [1., 1.]] (vocab 3, hidden 2) and hidden = [2., 3.] give logits
    [2., 3., 5.] (shape [3]); a [4, 2] hidden gives [4, 3] logits.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 02.2: LM head — one logit per vocabulary entry: hidden dotted with each row of the table
    return hidden @ weight.T
    # END EXERCISE


def vocab_parallel_embed(
    input_ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, group: TensorParallelGroup | None
) -> torch.Tensor:
    """Embedding lookup when the table is split by vocabulary: each rank holds rows vocab_start ..
    vocab_start + n - 1 of the whole table (`weight`, [n, hidden]), looks up the ids that fall in its range,
    gives zero rows for the others, and an all-reduce adds the ranks' answers, in which every id is non-zero on
    exactly one rank.

    input_ids: integer tensor of any shape, ids of the whole vocabulary (0 .. tp_size·n - 1). Returns
    input_ids.shape + (hidden,) in weight's dtype: for an id in this rank's range, row id - vocab_start of
    `weight`; for any other id, zeros; then all_reduce(result, group) (from minillm.utils.parallel; a no-op for
    group None). Never index `weight` with an id outside 0..n-1 (clamp or mask the local ids first: an id of
    another rank must not raise and must not pick up a row). The tests run two and three ranks in one process
    with a test double for the group (which records each all-reduce in its list `reduced`: exactly one per
    call), check each rank's answer before the sum and that the ranks' answers add up
    to the whole table's lookup, for a 1-D and a 2-D batch of ids.

    Example: vocabulary 4 split over 2 ranks, rank 1 holds rows 2-3 = [[5., 5.], [7., 7.]] (vocab_start 2): ids
    [0, 3, 2] give [[0., 0.], [7., 7.], [5., 5.]] on rank 1 before the all-reduce.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 10.4: vocab-parallel embedding — look up this rank's ids, zero the others, all-reduce
    local = input_ids - vocab_start
    mine = (local >= 0) & (local < weight.shape[0])
    rows = embed(local.clamp(0, weight.shape[0] - 1), weight).masked_fill(~mine[..., None], 0)
    return all_reduce(rows, group)
    # END EXERCISE


class VocabParallelEmbedding(nn.Module):
    """The embedding table, [vocab_size, hidden_size], split by vocabulary across tensor-parallel ranks: each
    rank looks up the ids in its range, zeros the rest, and an all-reduce adds the ranks' rows together.
    `kernel`, when the platform's linear method sets one, looks rows up in a table of another layout (the LM head's packed
    weight, tied)."""

    kernel = None

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size, self.tp_group = get_tp_rank(), get_tp_size(), get_tp_group()
        self.num_embeddings_per_rank = divide(num_embeddings, self.tp_size, "vocabulary size")
        self.vocab_start = self.tp_rank * self.num_embeddings_per_rank
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_rank, embedding_dim))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None):
        copy_checked(param.data, loaded_weight, "embedding", 0, self.tp_rank, self.tp_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return (self.kernel or embed)(input_ids, self.weight)
        return vocab_parallel_embed(input_ids, self.weight, self.vocab_start, self.tp_group)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; with tied embeddings it shares the embedding table's weight. Each rank scores its
    slice of the vocabulary; rank 0 gathers the full logits (the other ranks return None). `kernel`, as a linear
    layer's, replaces the plain product when the platform's linear method sets one."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = lm_logits(hidden, self.weight) if self.kernel is None else self.kernel(hidden, self.weight)
        if self.tp_size == 1:
            return logits
        parts = self.tp_group.gather(logits.contiguous())
        return torch.cat(parts, dim=-1) if parts else None
