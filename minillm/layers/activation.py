"""SwiGLU's activation: the gate and up projections arrive packed in one tensor."""
import torch
import torch.nn.functional as F
from torch import nn


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Split the last dimension into [gate, up] halves and return silu(gate) * up."""
    # BEGIN EXERCISE 03.4: SwiGLU activation — split into gate and up halves, return silu(gate) * up
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
    # END EXERCISE


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
