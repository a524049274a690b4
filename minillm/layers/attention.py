"""Attention: each token's query looks at the keys of itself and the tokens before it (causal)."""
import torch
from torch import nn

from minillm.layers.paged_attention import gather_context, paged_decode_attention, prefill_attention, store_kvcache
from minillm.utils.context import get_context


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
    """The attention step of a layer, given already-projected and rotated q, k, v.

    With no step context (chapter 03) it attends over the given tokens as one sequence. With a context and a
    KV cache (chapters 04+), it first stores the new keys/values in their cache slots, then runs prefill
    attention over packed sequences, or decode attention of one query per sequence over the paged cache.
    """

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.scale, self.num_kv_heads = num_heads, head_dim, scale, num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])  # views into the engine's cache, set by the runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        if ctx is None:
            return causal_attention(q, k, v, self.scale)
        if self.k_cache.numel():
            store_kvcache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        if not ctx.is_prefill:
            return paged_decode_attention(q, self.k_cache, self.v_cache, ctx.block_tables, ctx.context_lens,
                                          self.scale)
        cu_q, cu_k = ctx.cu_seqlens_q.tolist(), ctx.cu_seqlens_k.tolist()
        if ctx.block_tables is not None:  # some keys were computed in earlier steps: read them all from the cache
            k, v = gather_context(self.k_cache, ctx.block_tables, cu_k), gather_context(self.v_cache, ctx.block_tables, cu_k)
        return prefill_attention(q, k, v, cu_q, cu_k, self.scale)
