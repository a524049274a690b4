"""Linear layers that know how to load their weights.

Checkpoints store q_proj, k_proj, v_proj (and gate_proj, up_proj) as separate tensors; minillm packs each
group into one matmul. Each parameter carries a `weight_loader(param, loaded_weight, shard_id)` that copies
a checkpoint tensor into its slice, so the loader needs no knowledge of the layout. The names are vLLM's:
chapter 10 splits these layers across tensor-parallel ranks.
"""
import torch
import torch.nn.functional as F
from torch import nn

from minillm.utils.parallel import all_reduce, divide, get_tp_rank, get_tp_size


def copy_checked(dst: torch.Tensor, src: torch.Tensor, what: str, dim: int | None = None, rank: int = 0,
                 tp_size: int = 1) -> None:
    """Copy src into dst, or say which tensor has the wrong shape and what was expected. With `dim`, src is the
    whole checkpoint tensor, split in tp_size equal parts along dim, and dst receives part `rank`."""
    expected = [n * (tp_size if d == dim else 1) for d, n in enumerate(dst.shape)]
    if list(src.shape) != expected:
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(src.shape)}, expected {tuple(expected)}")
    dst.copy_(src if dim is None else src.narrow(dim, rank * dst.shape[dim], dst.shape[dim]))


class LinearBase(nn.Module):
    """y = x @ W.T (+ b), with a weight_loader on each parameter. `tp_dim` is the dimension of W that the
    tensor-parallel ranks split (0: output features, 1: input features, None: every rank holds all of W)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_dim: int | None = None):
        super().__init__()
        self.tp_rank, self.tp_size, self.tp_dim = get_tp_rank(), get_tp_size(), tp_dim
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
        return F.linear(x, self.weight, self.bias)


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
        return all_reduce(F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several linears of the same input stacked along the output: gate_proj and up_proj as shards 0 and 1.
    Each rank holds its slice of every shard, packed the same way."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = [divide(n, get_tp_size(), "output features") for n in output_sizes]  # per rank
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int):
        size = self.output_sizes[shard_id]
        offset = sum(self.output_sizes[:shard_id])
        copy_checked(param.data.narrow(0, offset, size), loaded_weight, f"shard {shard_id}", 0, self.tp_rank,
                     self.tp_size)


class QKVParallelLinear(MergedColumnParallelLinear):
    """q_proj, k_proj and v_proj in one matmul: shards "q", "k", "v" of num_heads and num_kv_heads heads
    (each rank holds its share of the heads)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str):
        super().weight_loader(param, loaded_weight, "qkv".index(shard_id))
