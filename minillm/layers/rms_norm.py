"""RMSNorm: scale each vector to unit root-mean-square, then by a learned per-channel weight."""

import torch
from torch import nn

from minillm.utils.compile import hot, layers_compiled


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise every vector of x to root mean square 1 along the last dimension, then scale it by weight.

    x is [..., hidden] in any float dtype (fp32, fp16, bf16); weight is [hidden], one learned scale per
    channel; eps is a small float (1e-6 in Qwen3). Returns a tensor of x's shape and x's dtype:

        out = x / sqrt(mean(x², over the last dimension) + eps) * weight

    Each vector (each token, or each head of each token when x is [tokens, heads, head_dim]) is normalised on
    its own. Square and average in float32 even when x is 16-bit (in fp16, 300² overflows to inf), cast the
    normalised x back to x's dtype, then multiply by weight. eps goes inside the square root: a zero vector
    comes out zero, not NaN, and a large eps visibly shrinks small vectors (a test uses eps = 0.5). The tests
    compare with torch's F.rms_norm.

    Example: x = [3, 4], weight = [1, 2], eps = 0: mean(x²) = 12.5, the RMS is 3.536, out = [0.849, 2.263].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 03.1: RMSNorm — divide by the root mean square of the last dimension, then scale by weight
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x.to(dtype) * weight
    # END EXERCISE


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's residual add and the RMSNorm that follows it, as one function: (rms_norm(x + residual), x + residual).

    x is a sublayer's output and residual the running sum of the layer's input and earlier outputs, both
    [tokens, hidden] in the same float dtype; weight [hidden] and eps as for rms_norm. Returns a pair:
    first the normalised sum (rms_norm of x + residual with weight and eps, in x's dtype), then the new
    residual x + residual itself, which the next layer adds its own output to. Neither input is modified.

    Eagerly this is an add, then the five or so operations of rms_norm, each reading and writing all of
    [tokens, hidden] once. Compiled (chapter 08), inductor fuses the add, the squares, the mean, the rsqrt and
    the scaling into one kernel that reads x and residual once and writes both outputs. The tests compare both
    outputs with x + residual and torch's F.rms_norm (fp32 and bf16), check that the inputs are unchanged,
    and compile your function and count its kernels: there must be exactly one.

    Example: x = [1, 2], residual = [2, 2], weight = [1, 1], eps = 0: the sum is [3, 4]; its RMS is 3.536, so
    the pair is ([0.849, 1.131], [3, 4]).
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 08.1: add + RMSNorm — the new residual x + residual, and its RMSNorm, as one fusible function
    residual = x + residual
    return rms_norm(residual, weight, eps), residual
    # END EXERCISE


class RMSNorm(nn.Module):
    """RMSNorm with an optional fused residual add: norm(x + residual), returning the new residual too."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    kernel = None  # the platform's fused version, kernel(x, residual, weight, eps), set when an engine loads

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.kernel is not None and not layers_compiled():
            return self.kernel(x, residual, self.weight, self.eps)
        if residual is None:
            return hot(rms_norm)(x, self.weight, self.eps)
        return hot(add_rms_norm)(x, residual, self.weight, self.eps)
