"""The CPU attention backend: minillm's C++ kernels (minillm.kernels.cpu), as vLLM's CPU backend has its own."""

import torch

from minillm.kernels.cpu import cpu_kernels, decode_attention_cpu, paged_decode_attention_cpu, store_kvcache_cpu
from minillm.layers.attention.backends.torch import TorchAttentionBackend
from minillm.utils.context import Context


class CPUAttentionBackend(TorchAttentionBackend):
    """Float32 decode attention that reads each sequence's keys and values in place through its block table
    instead of copying them out first (2-9x faster than the torch path), and the store of each step's keys and
    values (one copy per token instead of indexed writes); over an int8 cache the kernels quantize as they store
    and convert in registers as they read. Prefill is the torch backend's: one fused SDPA call per sequence.

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

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context, k_scale=None, v_scale=None) -> None:
        if self.native(k):
            store_kvcache_cpu(k, v, k_cache, v_cache, ctx.slot_mapping, ctx.is_prefill, k_scale, v_scale)
        else:
            super().store_kvcache(k, v, k_cache, v_cache, ctx, k_scale, v_scale)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float, k_scale=None, v_scale=None) -> torch.Tensor:
        kv = k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale, k_scale, v_scale
        if self.native(q):
            return paged_decode_attention_cpu(q, *kv)
        out, block_size = [], k_cache.shape[1]
        for a in range(0, len(q), self.decode_rows):
            rows = slice(a, a + self.decode_rows)
            width = -(-max(ctx.context_lens_cpu[rows]) // block_size)
            tables, lens = ctx.block_tables[rows, :width], ctx.context_lens[rows]
            out.append(self.paged_decode(q[rows], k_cache, v_cache, tables, lens, scale, k_scale, v_scale))
        return torch.cat(out)

    def decode_in_graph(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float, k_scale=None, v_scale=None):
        if not self.native(q):
            return None
        return decode_attention_cpu(q, k, v, k_cache, v_cache, ctx, scale, k_scale, v_scale)
