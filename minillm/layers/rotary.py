"""Rotary position embeddings (RoPE): rotate pairs of query/key channels by an angle that grows with position.

Channel i is paired with channel i + head_dim/2 (the "neox" layout Qwen and Llama checkpoints use), and the
pair is rotated by position * inv_freq[i]. A dot product of two rotated vectors then depends only on the
distance between their positions.
"""
import math

import torch
from torch import nn


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
    """Rotate x [tokens, heads, head_dim] by the per-token angles whose cos/sin are [tokens, head_dim/2]."""
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

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
