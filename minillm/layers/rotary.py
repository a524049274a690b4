"""Rotary position embeddings (RoPE): rotate pairs of query/key channels by an angle that grows with position.

Channel i is paired with channel i + head_dim/2 (the "neox" layout Qwen and Llama checkpoints use), and the
pair is rotated by position * inv_freq[i]. A dot product of two rotated vectors then depends only on the
distance between their positions.
"""

import math

import torch
from torch import nn

from minillm.utils.compile import hot, layers_compiled


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Angular frequency of each channel pair: theta^(-2i/head_dim), adjusted by the checkpoint's rope scaling."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":  # positions squeezed by `factor`
        return inv_freq / scaling["factor"]
    if kind == "llama3":  # low frequencies slowed by `factor`, high ones kept, a smooth ramp between
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_len / wavelen - lo) / (hi - lo)).clamp(0, 1)
        return (1 - smooth) * inv_freq / factor + smooth * inv_freq
    raise NotImplementedError(
        f"rope scaling type {kind!r} is not supported; minillm knows 'default', 'linear' and 'llama3'."
    )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each channel pair of every head of x by its token's angle (RoPE); return the rotated x.

    x is [tokens, heads, head_dim] (queries or keys); cos and sin are [tokens, head_dim/2]: row t holds the
    cosine and sine of token t's angle for each pair i (position · inv_freq[i]), the same for every head.
    Channel i pairs with channel i + head_dim/2, so the pairs are (x1[i], x2[i]) for the first half x1 and
    the second half x2 of the last dimension (not even and odd channels). Pair i, a point in the plane, is
    rotated by its angle a:

        x1'[i] = x1[i]·cos a − x2[i]·sin a,    x2'[i] = x2[i]·cos a + x1[i]·sin a

    Returns [tokens, heads, head_dim] with x1' in the first half and x2' in the second, in x's dtype (compute
    in float32; bf16 in gives bf16 out). At angle 0 (cos 1, sin 0) x comes back unchanged. The tests compare
    with the same rotation written as a product of complex numbers, and check that the dot product of a
    rotated query and key depends only on the distance between their positions.

    Example: head_dim 2, x = [[[1, 0]]], cos = [[0]], sin = [[1]] (a quarter turn): out = [[[0, 1]]].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 03.2: rotary embedding — rotate each pair (x1[i], x2[i]) of the two halves by the token's angle
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    # END EXERCISE


class RotaryEmbedding(nn.Module):
    """Precomputes cos/sin for every position up to max_position and rotates queries and keys."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None = None):
        super().__init__()
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float), rope_inv_freq(head_dim, theta, scaling))
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False)

    kernel = None  # the platform's version, kernel(positions, q, k, cos_sin_cache), set when an engine loads

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if self.kernel is not None and not layers_compiled():
            return self.kernel(positions, q, k, self.cos_sin_cache)
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        return hot(apply_rotary)(q, cos, sin), hot(apply_rotary)(k, cos, sin)
