"""Linear layers that know how to load their weights.

Checkpoints store q_proj, k_proj, v_proj (and gate_proj, up_proj) as separate tensors; minillm packs each
group into one matmul. Each parameter carries a `weight_loader(param, loaded_weight, shard_id)` that copies
a checkpoint tensor into its slice, so the loader needs no knowledge of the layout. The names are vLLM's:
chapter 10 splits these layers across tensor-parallel ranks.
"""
import torch
import torch.nn.functional as F
from torch import nn


def copy_checked(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    """Copy src into dst, or say which tensor has the wrong shape and what was expected."""
    if dst.shape != src.shape:
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src)


class LinearBase(nn.Module):
    """y = x @ W.T (+ b), with a weight_loader on each parameter."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None):
        copy_checked(param.data, loaded_weight, "weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """A linear layer whose output features can be split across ranks (chapter 10)."""


class RowParallelLinear(LinearBase):
    """A linear layer whose input features can be split across ranks (chapter 10)."""


class MergedColumnParallelLinear(LinearBase):
    """Several linears of the same input stacked along the output: gate_proj and up_proj as shards 0 and 1."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int):
        offset = sum(self.output_sizes[:shard_id])
        copy_checked(param.data.narrow(0, offset, self.output_sizes[shard_id]), loaded_weight, f"shard {shard_id}")


class QKVParallelLinear(MergedColumnParallelLinear):
    """q_proj, k_proj and v_proj in one matmul: shards "q", "k", "v" of num_heads and num_kv_heads heads."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str):
        super().weight_loader(param, loaded_weight, "qkv".index(shard_id))
