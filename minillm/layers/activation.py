"""SwiGLU's activation: the gate and up projections arrive packed in one tensor."""

import torch
import torch.nn.functional as F
from torch import nn

from minillm.utils.compile import hot, layers_compiled


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: split x's last dimension into [gate | up] halves and return silu(gate) * up.

    x is [..., 2·n], the output of gate_up_proj, with any number of leading dimensions: its first n channels
    are the gate projection (shard 0), the last n the up projection (shard 1). Returns [..., n] in x's dtype
    (bf16 in gives bf16 out), where silu(g) = g · sigmoid(g) = g / (1 + e^(−g)) is applied to the gate half
    only and multiplied by the up half channel by channel. n may be odd (14 channels give 7).

    Example: x = [−2, 0, 3, 5, 7, −1] is gate [−2, 0, 3] and up [5, 7, −1]; silu(gate) = [−0.238, 0, 2.858],
    so the output is [−1.192, 0, −2.858].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 03.4: SwiGLU activation — split into gate and up halves, return silu(gate) * up
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
    # END EXERCISE


class SiluAndMul(nn.Module):
    kernel = None  # the platform's version of silu_and_mul, set when an engine loads the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and not layers_compiled():
            return self.kernel(x)
        return hot(silu_and_mul)(x)
