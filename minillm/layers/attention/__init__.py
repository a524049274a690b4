"""Attention: each token's query looks at the keys of itself and the tokens before it (causal).

Chapter 03's reference attention over one sequence, and the Attention layer, which over the paged cache
(chapters 04+) hands the work to the attention backend the platform chose (minillm.layers.attention.backends)."""

import torch
from torch import nn

from minillm.layers.attention.backends import TorchAttentionBackend
from minillm.utils.context import Context, get_context


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention over one sequence.

    q is [tokens, num_heads, head_dim]; k and v are [tokens, num_kv_heads, head_dim], where num_heads is a
    multiple of num_kv_heads and each KV head is shared by group = num_heads / num_kv_heads consecutive query
    heads: query head h reads KV head h // group (with 8 query heads and 2 KV heads, heads 0-3 read KV head 0
    and heads 4-7 read KV head 1). scale is a float, usually head_dim ** -0.5. For every query head h and
    query position t, over the key positions s:

        score(t, s) = scale · (q[t, h] · k[s, h // group])     and −inf where s > t (a future token)
        p(t, s)     = softmax over s of score(t, s)             (each row sums to 1)
        out[t, h]   = Σ_s p(t, s) · v[s, h // group]

    Returns [tokens, num_heads, head_dim] in q's dtype; compute in float32. Output t must not depend on any
    later token (a test changes the last keys and values and checks that earlier outputs stay the same). The
    tests compare with torch's scaled_dot_product_attention(is_causal=True) for one token, num_kv_heads ==
    num_heads (MHA), GQA, and a single KV head (MQA).

    Example: one head, head_dim 1, scale 1, q = k = [[[1]], [[1]]], v = [[[2]], [[4]]]: token 0 sees only
    itself, out 2; token 1 weighs both keys equally (scores 1 and 1), out 3.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
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
    attention over packed sequences, or decode attention of one query per sequence over the paged cache, or
    both in a mixed step (chapter 06), with the backend the platform chose.
    """

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.scale, self.num_kv_heads = num_heads, head_dim, scale, num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])  # views into the engine's cache, set by the runner
        self.k_scale = self.v_scale = None  # kv_cache_dtype="int8": the cache's scales [blocks, block_size, kv_heads]
        self.backend = TorchAttentionBackend()  # the platform's, set when an engine loads the model
        self.layer_id = 0  # this layer's index in the step context's attn_layers (set with the backend)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # inside torch.compile: the backend's decode op, or one opaque op
            ctx = get_context()
            if ctx is not None and not ctx.is_prefill and self.k_cache.numel():
                cache, scales = (self.k_cache, self.v_cache), (self.k_scale, self.v_scale)
                out = self.backend.decode_in_graph(q, k, v, *cache, ctx, self.scale, *scales)
                if out is not None:
                    return out
            return attention_op(q, k, v, self.layer_id)
        return self.attend(q, k, v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store, then attend, each entry of the backend given the cache and its scales (None, None unless
        kv_cache_dtype="int8": then the backend quantizes what it stores and dequantizes what it reads)."""
        ctx = get_context()
        if ctx is None:
            return causal_attention(q, k, v, self.scale)
        cache, scales = (self.k_cache, self.v_cache), (self.k_scale, self.v_scale)
        if self.k_cache.numel():
            self.backend.store_kvcache(k, v, *cache, ctx, *scales)
        if ctx.num_decodes:  # a mixed step: its decode rows first, then its prompt chunks
            return self.attend_mixed(q, k, v, ctx)
        if ctx.is_prefill:
            return self.backend.prefill(q, k, v, *cache, ctx, self.scale, *scales)
        return self.backend.decode(q, *cache, ctx, self.scale, *scales)

    def attend_mixed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Context) -> torch.Tensor:
        """A step of decode tokens and prompt chunks (their keys and values stored already): the first
        num_decodes rows attend as a decode step, reading the cache in place, the rest as a prefill."""
        n, out = ctx.num_decodes, torch.empty_like(q)
        cache, scales = (self.k_cache, self.v_cache), (self.k_scale, self.v_scale)
        out[:n] = self.backend.decode(q[:n], *cache, ctx.decode_rows, self.scale, *scales)
        if len(q) > n:
            rows = ctx.prefill_rows
            out[n:] = self.backend.prefill(q[n:], k[n:], v[n:], *cache, rows, self.scale, *scales)
        return out


@torch.library.custom_op("minillm::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    """A layer's whole attention (store the new keys and values, then attend) as one operator that
    torch.compile does not look into, as vLLM's `unified_attention`: its work depends on the step's host-side
    lists (sequence lengths), which a compiled graph would otherwise freeze in, and it writes the KV cache,
    which the graph would otherwise copy. The layer is found by its index in the step context (as vLLM finds it in
    its forward context), so only tensors and an int cross the boundary."""
    return get_context().attn_layers[layer_id].attend(q, k, v)


@attention_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    return torch.empty_like(q)  # what the compiler needs to know: the output's shape, dtype and device
