"""Tiny tensor warm-ups for chapter 00: the PyTorch operations that the later exercises use.

Each function is one to three lines of torch: picking one entry per row (gather), splitting heads (view and
transpose), a causal softmax (masked_fill with -inf), ranks within a row (sort, then scatter to undo it) and
pairwise scores (matmul with broadcasting). Nothing in the engine calls them; they are graded on their own by
`python -m minillm.course grade 00`, and notebook 00 explains each operation before its warm-up.
"""

import torch


def chosen_scores(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The score each row gives to its chosen id: out[r] = scores[r, ids[r]] for every row r.

    scores is [..., V] (any float dtype, any number of leading dimensions, even none); ids is a long tensor
    with exactly scores' leading shape [...], one id in 0..V-1 per row. Returns a tensor of shape [...] (the
    ids' shape, the last dimension gone) and of scores' dtype, holding for every row the entry at column
    ids[row]. An id may repeat across rows; neither input is modified. This is how an engine reads the
    log-probability of each sampled token from a [tokens, vocab] table of log-probabilities.

    Example: scores [[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]] and ids [1, 0] give [0.7, 0.5]. With scores of shape
    [2, 3, V] and ids of shape [2, 3], the result is [2, 3]; with scores [V] and a 0-dimensional id, a
    0-dimensional tensor.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 00.1: gather — pick one entry per row, the column its id names
    return scores.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    # END EXERCISE


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split x [T, H*D] into heads: return [H, T, D], where head h holds the columns h*D .. (h+1)*D - 1.

    x has T rows (tokens) of H*D numbers; num_heads is H and D = x.shape[1] // H (H divides x.shape[1]).
    The result is a view of x, not a copy: no number moves in memory, so writing into x shows through it
    (the tests check that it shares x's storage). result[h, t] equals x[t, h*D:(h+1)*D]. It is not
    contiguous, and that is fine. T may be 1 and H may be 1 (then the result is x with a new first axis).

    Example: x = [[0, 1, 2, 3], [4, 5, 6, 7]] (T=2, H*D=4) with num_heads=2 gives head 0 = [[0, 1], [4, 5]]
    and head 1 = [[2, 3], [6, 7]], a tensor of shape [2, 2, 2].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 00.2: view and transpose — [T, H*D] to [T, H, D], then swap the first two axes
    return x.view(x.shape[0], num_heads, -1).transpose(0, 1)
    # END EXERCISE


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of attention scores [..., Tq, Tk], each query seeing only the past.

    The Tq queries are the last Tq of Tk positions (Tq <= Tk): query i sits at position Tk - Tq + i and may
    see keys 0 .. Tk - Tq + i. Every later key is masked: its score becomes -inf before the softmax, so its
    probability is exactly 0. Returns a new tensor of scores' shape and dtype whose rows sum to 1; scores
    itself is not modified. Leading dimensions (batch, heads) are kept. With Tq == Tk this is the plain
    causal mask (row 0 sees only key 0, so it is [1, 0, 0, ...]); with Tq == 1 (one new token) nothing
    is masked and it is an ordinary softmax.

    Example: scores of zeros, Tq = Tk = 3, give [[1, 0, 0], [1/2, 1/2, 0], [1/3, 1/3, 1/3]]; zeros with
    Tq = 2 and Tk = 3 give [[1/2, 1/2, 0], [1/3, 1/3, 1/3]].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 00.3: mask the future with -inf, then softmax over the keys
    tq, tk = scores.shape[-2:]
    allowed = torch.ones(tq, tk, dtype=torch.bool, device=scores.device).tril(tk - tq)
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    # END EXERCISE


def descending_ranks(x: torch.Tensor) -> torch.Tensor:
    """The rank of each entry within its row: 0 for the row's largest, 1 for the next, ..., N-1 for the smallest.

    x is [..., N] (any leading dimensions); returns a long (int64) tensor of the same shape, on x's device,
    where out[..., i] is the position x[..., i] would take if its row were sorted in descending order.
    Each row of the result is a permutation of 0..N-1, even when values tie (tied entries get different
    ranks, in any order). x is not modified. Sorting a row gives the order; the ranks are that order
    undone: the entry sorted to position r gets rank r, written back where it came from.

    Example: [[0.1, 0.9, 0.5]] gives [[2, 0, 1]]; a row of one entry gives [0].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 00.4: sort each row, then scatter the positions 0..N-1 back to where each entry came from
    order = x.argsort(dim=-1, descending=True)
    positions = torch.arange(x.shape[-1], device=x.device).expand_as(order)
    return torch.empty_like(order).scatter(-1, order, positions)
    # END EXERCISE


def pairwise_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Every query dotted with every key: q [..., Tq, D] and k [..., Tk, D] give scores [..., Tq, Tk].

    out[..., i, j] is the dot product of q[..., i, :] and k[..., j, :] over D. The leading dimensions
    broadcast as in any torch arithmetic: k [Tk, D] (no batch) is shared by every batch entry of q
    [B, Tq, D], and q [B, 1, Tq, D] with k [1, H, Tk, D] gives [B, H, Tq, Tk]. Both inputs have the same
    dtype, which the result keeps; neither is modified. This is the first step of attention, before the
    scale and the softmax.

    Example: q = [[1, 0], [0, 2]] and k = [[3, 4], [5, 6], [7, 8]] give [[3, 5, 7], [8, 12, 16]] (shape
    [2, 3]).
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 00.5: matmul — queries times the transposed keys, broadcast over leading dimensions
    return q @ k.transpose(-2, -1)
    # END EXERCISE
