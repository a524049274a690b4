"""Linear layers that know how to load their weights.

Checkpoints store q_proj, k_proj, v_proj (and gate_proj, up_proj) as separate tensors; minillm packs each
group into one matmul. Each parameter carries a `weight_loader(param, loaded_weight, shard_id)` that copies
a checkpoint tensor into its slice, so the loader needs no knowledge of the layout. The names are vLLM's:
chapter 10 splits these layers across tensor-parallel ranks.
"""

import torch
import torch.nn.functional as F
from torch import nn

from minillm.utils.parallel import TensorParallelGroup, all_reduce, divide, get_tp_group, get_tp_rank, get_tp_size


def shard(weight: torch.Tensor, dim: int, rank: int, tp_size: int) -> torch.Tensor:
    """This rank's part of a checkpoint tensor: `weight` cut along `dim` into tp_size equal, contiguous pieces,
    and piece number `rank` (0-based) returned.

    weight: a tensor of any shape whose size along dim divides by tp_size (the caller checked). dim: the
    dimension to cut (0 splits a linear layer's output features, the rows of W; 1 its input features, the
    columns). rank: 0..tp_size-1. Returns a view (no copy) of shape weight.shape with dim divided by
    tp_size: along dim, the entries rank·n .. (rank+1)·n - 1, where n = weight.shape[dim] // tp_size. With
    tp_size 1 the whole tensor comes back. The tests cut a [6, 6] tensor both ways for sizes 1, 2 and 3
    and check that the pieces are views that concatenate back to the whole, cut a [4, 2] tensor both ways in
    two, and load a column- and a row-parallel layer through your function rank by rank.

    Example: weight = [[0, 1], [2, 3], [4, 5], [6, 7]], dim 0, tp_size 2: rank 0 gets [[0, 1], [2, 3]], rank 1
    [[4, 5], [6, 7]]; with dim 1, rank 1 gets [[1], [3], [5], [7]].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 10.1: shard a checkpoint tensor — piece `rank` of tp_size equal pieces along dim, as a view
    n = weight.shape[dim] // tp_size
    return weight.narrow(dim, rank * n, n)
    # END EXERCISE


def qkv_shard_range(shard_id: str, num_heads: int, num_kv_heads: int, head_dim: int, tp_size: int) -> tuple[int, int]:
    """Where q_proj, k_proj or v_proj lands in one rank's packed qkv_proj weight: (first row, number of rows).

    Each rank keeps num_heads / tp_size query heads and num_kv_heads / tp_size key/value heads (num_heads and
    num_kv_heads are the model's totals; both divide by tp_size), each head_dim rows, packed in the order q,
    then k, then v. shard_id is "q", "k" or "v". Returns a tuple of two ints (offset, size): the q part starts
    at row 0 and has (num_heads / tp_size) · head_dim rows; k follows right after it with (num_kv_heads /
    tp_size) · head_dim rows; v follows k with as many. The offsets are the same on every rank: only which heads
    a rank holds differs. The tests check MHA, GQA and one KV head, tp_size 1, 2 and 4, and load a
    QKVParallelLinear through your function rank by rank.

    Example: 8 query heads, 2 KV heads, head_dim 4, tp_size 2: q is (0, 16), k is (16, 4), v is (20, 4), so
    each rank's packed weight has 24 rows.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 10.2: QKV shard offsets — per-rank heads of q, then k, then v, packed in one weight
    q, kv = num_heads // tp_size * head_dim, num_kv_heads // tp_size * head_dim
    return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
    # END EXERCISE


def row_parallel_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tp_rank: int,
    group: TensorParallelGroup | None,
    linear=F.linear,
) -> torch.Tensor:
    """The forward pass of a row-parallel linear layer on one rank: a partial y, summed over the ranks.

    W, [out, in], is split by input features (columns): this rank holds `weight`, [out, in / tp_size], and `x`
    is the matching slice of the input, [tokens, in / tp_size] (the output of a column-parallel layer, already
    split the same way). x @ weightᵀ is this rank's partial result, [tokens, out]; the ranks' partials add up to
    the full x_whole @ Wᵀ. Compute it with `linear(x, weight, bias)`: F.linear by default, or the layer's
    kernel (on a CPU, the packed matmul, whose `weight` is in the packed layout: never use weight.T yourself,
    and never call F.linear directly). Sum the partials with all_reduce(partial, group) (from minillm.utils.parallel; in place, and
    a no-op for group None). `bias`, [out] or None, is whole on every rank: add it on rank 0 only (tp_rank 0),
    before the all-reduce, or it would be counted tp_size times. Returns [tokens, out], the same on every rank.
    The tests run two and three ranks in one process with a test double for the group that records each
    all-reduce (in its list `reduced`), check that each rank calls it exactly once, that the partials sum to the
    unsplit layer's output, and that the bias is counted once.

    Example: x_whole = [[1, 2]], W = [[1, 1]], bias [10], 2 ranks: rank 0 has x [[1]], W [[1]] and partial
    1 + 10 = 11; rank 1 has x [[2]], W [[1]] and partial 2; the all-reduce gives [[13]] on both.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 10.3: row-parallel forward — partial product, bias on rank 0 only, then all-reduce
    return all_reduce(linear(x, weight, bias if tp_rank == 0 else None), group)
    # END EXERCISE


def copy_checked(
    dst: torch.Tensor, src: torch.Tensor, what: str, dim: int | None = None, rank: int = 0, tp_size: int = 1
) -> None:
    """Copy src into dst, or say which tensor has the wrong shape and what was expected. With `dim`, src is the
    whole checkpoint tensor, split in tp_size equal parts along dim, and dst receives part `rank`."""
    expected = [n * (tp_size if d == dim else 1) for d, n in enumerate(dst.shape)]
    if list(src.shape) != expected:
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(src.shape)}, expected {tuple(expected)}")
    dst.copy_(src if dim is None else shard(src, dim, rank, tp_size))


class LinearBase(nn.Module):
    """y = x @ W.T (+ b), with a weight_loader on each parameter. `tp_dim` is the dimension of W that the
    tensor-parallel ranks split (0: output features, 1: input features, None: every rank holds all of W).
    `kernel`, set by the platform's linear method once the weights are loaded (minillm.layers.linear_method),
    replaces F.linear: kernel(x, weight, bias) on the weight in the layout it put there. None keeps F.linear."""

    kernel = None

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_dim: int | None = None):
        super().__init__()
        self.tp_rank, self.tp_size, self.tp_group, self.tp_dim = get_tp_rank(), get_tp_size(), get_tp_group(), tp_dim
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None):
        """Copy this rank's part of a checkpoint tensor (all of it for tp_dim None, or for a bias split by input)."""
        dim = self.tp_dim if self.tp_dim is not None and self.tp_dim < param.dim() else None
        copy_checked(param.data, loaded_weight, "weight", dim, self.tp_rank, self.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.kernel or F.linear)(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """A linear layer whose output features are split across ranks: each computes its slice of y."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, divide(output_size, get_tp_size(), "output features"), bias, tp_dim=0)


class RowParallelLinear(LinearBase):
    """A linear layer whose input features are split across ranks: each computes a partial y from its slice of
    x, and an all-reduce sums them (the bias is added once, by rank 0)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(divide(input_size, get_tp_size(), "input features"), output_size, bias, tp_dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:  # nothing split, nothing to reduce
            return super().forward(x)
        return row_parallel_linear(x, self.weight, self.bias, self.tp_rank, self.tp_group, self.kernel or F.linear)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several linears of the same input stacked along the output: gate_proj and up_proj as shards 0 and 1.
    Each rank holds its slice of every shard, packed the same way."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = [divide(n, get_tp_size(), "output features") for n in output_sizes]  # per rank
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int):
        size = self.output_sizes[shard_id]
        offset = sum(self.output_sizes[:shard_id])
        copy_checked(
            param.data.narrow(0, offset, size), loaded_weight, f"shard {shard_id}", 0, self.tp_rank, self.tp_size
        )


class QKVParallelLinear(MergedColumnParallelLinear):
    """q_proj, k_proj and v_proj in one matmul: shards "q", "k", "v" of num_heads and num_kv_heads heads
    (each rank holds its share of the heads)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, num_heads, num_kv_heads  # the model's totals
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str):
        offset, size = qkv_shard_range(shard_id, self.num_heads, self.num_kv_heads, self.head_dim, self.tp_size)
        copy_checked(
            param.data.narrow(0, offset, size), loaded_weight, f"{shard_id}_proj", 0, self.tp_rank, self.tp_size
        )
