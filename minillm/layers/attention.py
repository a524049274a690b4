"""Attention: each token's query looks at the keys of itself and the tokens before it (causal)."""
import torch
from torch import nn


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention over one sequence.

    q is [tokens, num_heads, head_dim]; k and v are [tokens, num_kv_heads, head_dim], each KV head shared by
    num_heads / num_kv_heads query heads. Returns [tokens, num_heads, head_dim].
    """
    # BEGIN EXERCISE 03.3: causal GQA attention — share KV heads, scale scores, mask the future, softmax, weight V
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    n = q.shape[0]
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
    # END EXERCISE


class Attention(nn.Module):
    """The attention step of a layer, given already-projected and rotated q, k, v."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.scale, self.num_kv_heads = num_heads, head_dim, scale, num_kv_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return causal_attention(q, k, v, self.scale)
