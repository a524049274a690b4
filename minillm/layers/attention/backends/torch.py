"""The torch attention backend: attention over the paged cache in plain torch ops, on any device."""

import torch

from minillm.layers.attention.paged_attention import (
    dequantize_kv,
    gather_context,
    gather_dequantized,
    paged_decode_attention,
    prefill_attention,
    quantize_kv,
    store_decode_kvcache,
    store_kvcache,
)
from minillm.utils.context import Context


class TorchAttentionBackend:
    """The reference every other backend (the CPU's C++ kernels, chapter 09's Triton kernels) is checked against,
    and the one the exercises plug into: chapter 04's store and chapter 05's paged decode attention as they are.

    Every entry takes the cache's scales too, None for a cache of the model's dtype. With kv_cache_dtype="int8"
    (chapter 14) they are float32 [num_blocks, block_size, kv_heads], one per token and KV head: what is stored is
    quantized (quantize_kv), and what attention reads is what the cache holds, dequantized."""

    name = "torch"

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context, k_scale=None, v_scale=None) -> None:
        # a prefill's slot -1: a token whose key is in a cached prefix block already, skipped; a decode step's: a
        # padded row, to the spare slot (no mask, so a CUDA graph can record it)
        store = store_kvcache if ctx.is_prefill else store_decode_kvcache
        if k_scale is not None:  # int8: the numbers and their scales go to the same slots
            (k, ks), (v, vs) = quantize_kv(k), quantize_kv(v)
            store(ks, vs, k_scale, v_scale, ctx.slot_mapping)
        store(k, v, k_cache, v_cache, ctx.slot_mapping)

    def prefill(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float, k_scale=None, v_scale=None):
        if ctx.block_tables is not None:  # some keys were computed in earlier steps: read them all from the cache
            k, v = (self.context(c, s, ctx, q.dtype) for c, s in ((k_cache, k_scale), (v_cache, v_scale)))
        elif k_scale is not None:  # a plain prefill could attend to its own float keys; it reads them as the cache
            # holds them instead, so a prompt computes the same whole, in chunks, after a cached prefix, or recomputed
            k, v = dequantize_kv(*quantize_kv(k), q.dtype), dequantize_kv(*quantize_kv(v), q.dtype)
        return prefill_attention(q, k, v, ctx.cu_seqlens_q_cpu, ctx.cu_seqlens_k_cpu, scale)

    @staticmethod
    def context(cache, scales, ctx: Context, dtype: torch.dtype) -> torch.Tensor:
        """Every sequence's keys (or values) from the cache, packed end to end (gather_context), dequantized."""
        keys = gather_context(cache, ctx.block_tables, ctx.cu_seqlens_k_cpu)
        if scales is None:
            return keys
        return dequantize_kv(keys, gather_context(scales, ctx.block_tables, ctx.cu_seqlens_k_cpu), dtype)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float, k_scale=None, v_scale=None) -> torch.Tensor:
        return self.paged_decode(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale, k_scale, v_scale)

    @staticmethod
    def paged_decode(q, k_cache, v_cache, tables, lens, scale: float, k_scale=None, v_scale=None) -> torch.Tensor:
        """paged_decode_attention; over an int8 cache, on the blocks in use copied out and dequantized
        (gather_dequantized), the tables renumbered to the copy. The kernels read int8 in place instead."""
        if k_scale is not None:
            k_cache = gather_dequantized(k_cache, k_scale, tables, q.dtype)
            v_cache = gather_dequantized(v_cache, v_scale, tables, q.dtype)
            tables = torch.arange(tables.numel(), device=q.device).view(tables.shape)
        return paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)

    def decode_in_graph(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float, k_scale=None, v_scale=None):
        """A decode step's store and attention as one op a compiled step calls directly (no Python in between),
        reading the step's tensors from the graph's inputs; None where the backend has none (then the compiled
        step calls the opaque attention_op)."""
        return None
