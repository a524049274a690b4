"""Triton kernels for the engine's hot spots (chapter 09): the KV-cache store, paged decode attention, RMSNorm.

Each has a torch reference in minillm.layers that it must equal (tests/test_kernels.py). On CUDA they are
compiled; on a CPU they run only in Triton's interpreter, with TRITON_INTERPRET=1 set before this package is
first imported (Triton reads it when a kernel is defined).
"""

from minillm.kernels.triton.common import INTERPRET, check_device
from minillm.kernels.triton.kv_cache import store_kvcache
from minillm.kernels.triton.layernorm import add_rms_norm, norm, rms_norm
from minillm.kernels.triton.paged_attention import paged_decode_attention

__all__ = [
    "INTERPRET",
    "add_rms_norm",
    "check_device",
    "norm",
    "paged_decode_attention",
    "rms_norm",
    "store_kvcache",
]
