"""The torch attention backend: attention over the paged cache in plain torch ops, on any device."""

import torch

from minillm.layers.attention.paged_attention import (
    dequantize_kv,
    gather_context,
    gather_context_int8,
    paged_decode_attention,
    paged_decode_attention_int8,
    prefill_attention,
    quantize_kv,
    store_decode_kvcache,
    store_kvcache,
    store_kvcache_int8,
)
from minillm.utils.context import Context


class TorchAttentionBackend:
    """The reference every other backend (the CPU's C++ kernels, chapter 09's Triton kernels) is checked against,
    and the one the exercises plug into: chapter 04's store and chapter 05's paged decode attention as they are."""

    name = "torch"

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context) -> None:
        if ctx.is_prefill:  # slot -1: a token whose key is in a cached prefix block already, skipped
            store_kvcache(k, v, k_cache, v_cache, ctx.slot_mapping)
        else:  # one token per row, padded rows to the spare slot: no mask, so a CUDA graph can record it
            store_decode_kvcache(k, v, k_cache, v_cache, ctx.slot_mapping)

    def prefill(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        if ctx.block_tables is not None:  # some keys were computed in earlier steps: read them all from the cache
            k = gather_context(k_cache, ctx.block_tables, ctx.cu_seqlens_k_cpu)
            v = gather_context(v_cache, ctx.block_tables, ctx.cu_seqlens_k_cpu)
        return prefill_attention(q, k, v, ctx.cu_seqlens_q_cpu, ctx.cu_seqlens_k_cpu, scale)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)

    def decode_in_graph(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor | None:
        """A decode step's store and attention as one op a compiled step calls directly (no Python in between),
        reading the step's tensors from the graph's inputs; None where the backend has none (then the compiled
        step calls the opaque attention_op)."""
        return None

    # kv_cache_dtype="int8" (chapter 14): the same steps over an int8 cache, each with its scales (k_scale, v_scale:
    # [num_blocks, block_size, kv_heads], float32). What attention reads is always what the cache holds: dequantized.

    def store_kvcache_int8(self, k, v, k_cache, v_cache, k_scale, v_scale, ctx: Context) -> None:
        store_kvcache_int8(k, v, k_cache, v_cache, k_scale, v_scale, ctx.slot_mapping, decode=not ctx.is_prefill)

    def prefill_int8(self, q, k, v, k_cache, v_cache, k_scale, v_scale, ctx: Context, scale: float) -> torch.Tensor:
        if ctx.block_tables is not None:  # earlier keys from the cache, dequantized (this step's are stored already)
            k = gather_context_int8(k_cache, k_scale, ctx.block_tables, ctx.cu_seqlens_k_cpu, q.dtype)
            v = gather_context_int8(v_cache, v_scale, ctx.block_tables, ctx.cu_seqlens_k_cpu, q.dtype)
        else:  # a plain prefill could attend to its own float keys; it reads them as the cache holds them instead,
            # so a prompt computes the same whole, in chunks, after a cached prefix, or recomputed after preemption
            k, v = dequantize_kv(*quantize_kv(k), q.dtype), dequantize_kv(*quantize_kv(v), q.dtype)
        return prefill_attention(q, k, v, ctx.cu_seqlens_q_cpu, ctx.cu_seqlens_k_cpu, scale)

    def decode_int8(self, q, k_cache, v_cache, k_scale, v_scale, ctx: Context, scale: float) -> torch.Tensor:
        return paged_decode_attention_int8(
            q, k_cache, v_cache, k_scale, v_scale, ctx.block_tables, ctx.context_lens, scale
        )

    def decode_in_graph_int8(self, q, k, v, k_cache, v_cache, k_scale, v_scale, ctx: Context, scale: float):
        """decode_in_graph over an int8 cache; None: the compiled step calls the opaque attention_op."""
        return None
