"""The CPU attention backend: minillm's C++ kernels (minillm.kernels.cpu), as vLLM's CPU backend has its own."""

import torch

from minillm.kernels.cpu import (
    cpu_kernels,
    paged_decode_attention_cpu,
    paged_decode_attention_int8_cpu,
    store_kvcache_cpu,
    store_kvcache_int8_cpu,
)
from minillm.layers.attention.backends.torch import TorchAttentionBackend
from minillm.layers.attention.paged_attention import paged_decode_attention
from minillm.utils.context import Context


class CPUAttentionBackend(TorchAttentionBackend):
    """Float32 decode attention that reads each sequence's keys and values in place through its block table
    instead of copying them out first (2-9x faster than the torch path), and the store of each step's keys and
    values (one copy per token instead of indexed writes). Prefill is the torch backend's: one fused SDPA call
    per sequence.

    Where the kernels cannot be built (or for other dtypes), decode attention runs the torch path in chunks of
    `decode_rows` sequences, each gathering and masking only up to its own longest context: torch's CPU attention
    slows down far more than linearly with the batch (measured: 128 sequences of 32-512 tokens take 3.8x longer in
    one call than in chunks of 16). The model runner orders a decode batch by length, so the sequences of a chunk
    have similar lengths."""

    name = "cpu"
    decode_rows = 16

    def __init__(self):
        self.built = cpu_kernels()

    def native(self, q: torch.Tensor) -> bool:
        return self.built and q.is_cpu and q.dtype == torch.float32

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context) -> None:
        if self.native(k):
            store_kvcache_cpu(k, v, k_cache, v_cache, ctx.slot_mapping, ctx.is_prefill)
        else:
            super().store_kvcache(k, v, k_cache, v_cache, ctx)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        if self.native(q):
            return paged_decode_attention_cpu(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)
        out, block_size = [], k_cache.shape[1]
        for a in range(0, len(q), self.decode_rows):
            rows = slice(a, a + self.decode_rows)
            width = -(-max(ctx.context_lens_cpu[rows]) // block_size)
            tables, lens = ctx.block_tables[rows, :width], ctx.context_lens[rows]
            out.append(paged_decode_attention(q[rows], k_cache, v_cache, tables, lens, scale))
        return torch.cat(out)

    def decode_in_graph(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor | None:
        if not self.native(q):
            return None
        return torch.ops.minillm_cpu.decode_attention(
            q, k, v, k_cache, v_cache, ctx.slot_mapping, ctx.block_tables, ctx.context_lens, scale
        )

    # kv_cache_dtype="int8": the kernels quantize as they store and convert in registers as they read
    def store_kvcache_int8(self, k, v, k_cache, v_cache, k_scale, v_scale, ctx: Context) -> None:
        if self.native(k):
            store_kvcache_int8_cpu(k, v, k_cache, v_cache, k_scale, v_scale, ctx.slot_mapping, ctx.is_prefill)
        else:
            super().store_kvcache_int8(k, v, k_cache, v_cache, k_scale, v_scale, ctx)

    def decode_int8(self, q, k_cache, v_cache, k_scale, v_scale, ctx: Context, scale: float) -> torch.Tensor:
        if self.native(q):
            return paged_decode_attention_int8_cpu(
                q, k_cache, v_cache, k_scale, v_scale, ctx.block_tables, ctx.context_lens, scale
            )
        return super().decode_int8(q, k_cache, v_cache, k_scale, v_scale, ctx, scale)

    def decode_in_graph_int8(self, q, k, v, k_cache, v_cache, k_scale, v_scale, ctx: Context, scale: float):
        if not self.native(q):
            return None
        return torch.ops.minillm_cpu.decode_attention_int8(
            q, k, v, k_cache, v_cache, k_scale, v_scale, ctx.slot_mapping, ctx.block_tables, ctx.context_lens, scale
        )
