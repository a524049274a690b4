"""The Triton attention backend: chapter 09's kernels (minillm.kernels.triton)."""

import torch

from minillm.layers.attention.backends.torch import TorchAttentionBackend
from minillm.utils.context import Context


class TritonAttentionBackend(TorchAttentionBackend):
    """Triton kernels for the two per-step pieces of attention that have no good framework kernel: storing the
    new keys and values into their scattered slots (one program per token, slot -1 skipped, no mask and no host
    sync) and decode attention read through the block tables (one program per sequence and KV head, an online
    softmax over its blocks); over an int8 cache the store kernel quantizes and the decode kernel loads int8
    numbers and their scales. Prefill attention stays on the torch path (the inherited `prefill`): it is one
    fused SDPA call per sequence already.

    On CUDA the kernels are compiled. On a CPU they run only in Triton's interpreter, which needs
    TRITON_INTERPRET=1 in the environment before minillm.kernels.triton is first imported; without it the first
    step raises an error that says so. Slow, but the same kernel source: the tests prove the wiring that way.
    """

    name = "triton"

    def __init__(self):
        # here, not at the top: Triton reads TRITON_INTERPRET when kernels are defined
        from minillm.kernels import triton as kernels

        self.kernels = kernels

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context, k_scale=None, v_scale=None) -> None:
        self.kernels.store_kvcache(k, v, k_cache, v_cache, ctx.slot_mapping, k_scale, v_scale)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float, k_scale=None, v_scale=None) -> torch.Tensor:
        tables, lens = ctx.block_tables, ctx.context_lens
        return self.kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, k_scale, v_scale)
