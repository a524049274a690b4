"""minillm's C++ kernels for the CPU (minillm/kernels/csrc), in the spirit of vLLM's CPU backend:

- paged decode attention that reads the KV cache in place (paged_attention_cpu.cpp). The torch path
  (`paged_decode_attention`) first copies every sequence's blocks into a padded tensor, then runs SDPA over it:
  each key is moved twice, and the padding is computed and masked. The kernel instead walks each sequence's
  block table, one task per (sequence, KV head) on all cores, with an online softmax over the blocks.
- storing a step's keys and values into their cache slots (kv_cache_cpu.cpp): one copy per token, where the
  torch path's indexed writes cost more than the copy itself at small batches.
- the elementwise layers (layers_cpu.cpp): RMSNorm with its residual add, SiLU-and-mul and the rotary embedding,
  each one call and one pass over its rows where the torch functions are five to ten ops each.
- the matmuls of the linear layers (linear_cpu.cpp), on a weight packed once into panels of output features:
  for one or two rows (decode at batch 1 or 2) a matrix-vector product bound by memory bandwidth, where BLAS
  reads the weights at a fraction of it; for more rows a matrix-matrix product, where BLAS repacks the weight on
  every call (the layouts: minillm.kernels.packing).
- the quantized matmuls (quant_linear_cpu.cpp) on int8 and GGUF blocks: for a few rows x is quantized blockwise
  to int8 and the products summed exactly in integer lanes, each weight byte read once; for many rows a panel of
  the weight is dequantized at a time and run through the float32 register tile.

They are compiled together on first use by torch.utils.cpp_extension (a C++ compiler and ninja; -march=native,
so built for this machine), once: the build is cached in torch's extensions directory under a name that carries
the instruction-set level and a digest of the flags, sources and CPU (extension_name). Where they cannot be
built, `cpu_kernels` says why in one warning and returns False, and callers keep the torch path. Nothing outside
minillm.kernels calls an op of the extension but through the functions here.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm.config import PACKED_PREFETCH

SOURCES = [
    Path(__file__).parent / "csrc" / name
    for name in (
        "paged_attention_cpu.cpp",
        "kv_cache_cpu.cpp",
        "linear_cpu.cpp",
        "layers_cpu.cpp",
        "quant_linear_cpu.cpp",
    )
]


def extension_name(isa: str, flags: list[str]) -> str:
    """The build's name in torch's extension cache, which is keyed by name: the instruction-set level, and a digest
    of the flags, the sources (and headers) and this CPU's feature flags. -march=native builds for this very CPU, so a cache
    shared between machines (or checkouts with other sources) must never hand one's build to another."""
    digest = hashlib.sha256(" ".join(flags).encode())
    for source in [*SOURCES, *sorted(SOURCES[0].parent.glob("*.h"))]:  # the headers they include too
        digest.update(source.read_bytes())
    cpuinfo = Path("/proc/cpuinfo")
    features = (
        next((line for line in cpuinfo.read_text().splitlines() if line.startswith(("flags", "Features"))), "")
        if cpuinfo.exists()
        else platform.processor()
    )
    digest.update(features.encode())
    return f"minillm_cpu_{isa.lower()}_{digest.hexdigest()[:12]}"


def build_flags() -> list[str]:
    isa = torch.backends.cpu.get_cpu_capability()  # at::vec's instruction set, as torch's own kernels pick it
    return ["-O3", "-march=native", "-fopenmp", f"-DCPU_CAPABILITY={isa}", f"-DCPU_CAPABILITY_{isa}"]


@functools.cache
def build_name() -> str:
    """This build's extension_name: also the kernels' version where a choice between them is cached."""
    return extension_name(torch.backends.cpu.get_cpu_capability(), build_flags())


@functools.cache
def cpu_kernels() -> bool:
    """Build and load the extension once; True when its ops (torch.ops.minillm_cpu.*) are ready, False (with one
    warning) if it cannot be built. The ops are registered as custom ops, so torch.compile keeps them opaque."""
    try:
        from torch.utils.cpp_extension import load

        if shutil.which("ninja") is None:  # the ninja wheel's binary, when the environment's bin is not on PATH
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        load(
            build_name(),
            [str(s) for s in SOURCES],
            extra_cflags=build_flags(),
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )
    except Exception as e:  # no compiler, no ninja, a failed build: the engine runs on without the kernels
        lines = str(e).splitlines() or [repr(e)]  # a failed build: its first line is the command, then the errors
        reason = next((line for line in lines[1:] if "error" in line), lines[0])[:300]
        warnings.warn(
            f"minillm: the CPU kernels could not be built ({type(e).__name__}: {reason}); decode "
            "attention and small matmuls take the slower torch path",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    torch.library.register_fake("minillm_cpu::paged_decode_attention")(lambda q, *args: torch.empty_like(q))
    torch.library.register_fake("minillm_cpu::decode_attention")(lambda q, *args: torch.empty_like(q))
    torch.library.register_fake("minillm_cpu::linear")(lambda x, packed, b, out, *_: x.new_empty(x.shape[0], out))
    torch.library.register_fake("minillm_cpu::quant_linear")(
        lambda x, w, s, b, qtype, out: x.new_empty(x.shape[0], out)
    )
    torch.library.register_fake("minillm_cpu::rms_norm")(lambda x, w, eps: x.new_empty(x.shape))
    torch.library.register_fake("minillm_cpu::add_rms_norm")(lambda x, r, w, eps: (x.new_empty(x.shape),) * 2)
    torch.library.register_fake("minillm_cpu::silu_and_mul")(lambda x: x.new_empty(*x.shape[:-1], x.shape[-1] // 2))
    torch.library.register_fake("minillm_cpu::rotary")(
        lambda pos, q, k, cache: (q.new_empty(q.shape), k.new_empty(k.shape))
    )
    return True


def paged_decode_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale=None, v_scale=None):
    """minillm.layers.attention.paged_attention.paged_decode_attention for a float32 q on the CPU, the cache read in
    place: same arguments, same result (to float rounding). A float32 cache, or an int8 one with its float32 scales
    [num_blocks, block_size, kv_heads] (kv_cache_dtype="int8"), its numbers converted to floats in registers. Every
    context_lens[i] must be ≥ 1; table entries past a sequence's context (the -1 padding) are never read."""
    return torch.ops.minillm_cpu.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale
    )


def store_kvcache_cpu(k, v, k_cache, v_cache, slot_mapping, is_prefill=True, k_scale=None, v_scale=None) -> None:
    """In place, token t's key and value to slot slot_mapping[t]: layers.attention.paged_attention.store_kvcache
    (a prefill: slot -1 writes nothing) or, with is_prefill False, store_decode_kvcache (slot -1 is a padded
    row's, written to the spare last slot). Into an int8 cache, given its scales: each head's vector quantized (as
    paged_attention.quantize_kv) into its slot of the cache and of the scales."""
    torch.ops.minillm_cpu.store_kvcache(k, v, k_cache, v_cache, slot_mapping, is_prefill, k_scale, v_scale)


def decode_attention_cpu(q, k, v, k_cache, v_cache, ctx, scale: float, k_scale=None, v_scale=None) -> torch.Tensor:
    """A decode step's store_kvcache_cpu and paged_decode_attention_cpu as one op, which a compiled step calls
    directly, reading the step's tensors (its slots, tables and lengths) from the context."""
    return torch.ops.minillm_cpu.decode_attention(
        q, k, v, k_cache, v_cache, ctx.slot_mapping, ctx.block_tables, ctx.context_lens, scale, k_scale, v_scale
    )


def empty_pages(shape: list[int]) -> torch.Tensor:
    """An uninitialised float32 tensor in a mapping of its own that the OS is asked to back by 2 MiB pages."""
    return torch.ops.minillm_cpu.empty_pages(shape)


def linear_packed(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_features: int,
    prefetch: tuple[int, int] = PACKED_PREFETCH["packed"],
) -> torch.Tensor:
    """F.linear(x, weight, bias) for float32 CPU tensors by the C++ kernel on packed = pack_weight(weight): a
    matrix-vector product for one or two rows of x (its leading dimensions flattened), prefetching the weight as
    `prefetch` says (hint, bytes ahead: config.PACKED_PREFETCH), a register-tiled matmul for more. Call
    `cpu_kernels()` first."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.ops.minillm_cpu.linear(rows, packed, bias, out_features, *prefetch)
    return y.view(*x.shape[:-1], out_features)


def linear_cpu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(x, weight, bias), by linear_packed where `packed` (pack_weight(weight)) is given and x is float32
    on the CPU, else by F.linear."""
    if packed is None or x.dtype != torch.float32 or not x.is_cpu:
        return F.linear(x, weight, bias)
    return linear_packed(x, packed, bias, out_features=weight.shape[0])


def norm_cpu(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """RMSNorm.forward by the C++ kernels: rms_norm(x, weight, eps), or with a residual add_rms_norm's pair."""
    if residual is None:
        return torch.ops.minillm_cpu.rms_norm(x, weight, eps)
    return torch.ops.minillm_cpu.add_rms_norm(x, residual, weight, eps)


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    """minillm.layers.activation.silu_and_mul for float32 CPU tensors, in one pass."""
    return torch.ops.minillm_cpu.silu_and_mul(x)


def rotary_cpu(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """RotaryEmbedding.forward by the C++ kernel: q and k rotated by each token's row of the cos | sin table."""
    return torch.ops.minillm_cpu.rotary(positions, q, k, cos_sin_cache)


def quant_linear(x, weight, scale=None, bias=None, *, qtype: int, out_features: int) -> torch.Tensor:
    """formats.quant_linear_reference(x, weight, qtype, scale, bias) for CPU tensors, x's leading dimensions
    flattened and kept: for qtype I8 the int8 weight [out, in] packed by pack_int8 with its float32 row scales
    `scale`, for Q8_0, Q4_0 and Q4_1 the uint8 GGUF blocks [out, in / 32 · block bytes]; in a multiple of 32. The
    kernel computes in float32: a 16-bit x (a bfloat16 model) is widened, exactly, and the result rounded back."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    bias = None if bias is None else bias.to(torch.float32)
    y = torch.ops.minillm_cpu.quant_linear(rows, weight, scale, bias, qtype, out_features)
    return y.view(*x.shape[:-1], out_features).to(x.dtype)


def quant_isa() -> str:
    """The instruction set the kernel was compiled for: "avx512_vnni" (512-bit integer dot products, where torch's
    capability is AVX-512), "avx2" or "scalar"."""
    return torch.ops.minillm_cpu.quant_isa()


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS. glibc keeps freed blocks below the top of its heap for reuse, so
    the plain weights freed after packing would stay resident (about 200 MB for SmolLM2-135M); malloc_trim
    releases them. Elsewhere (no glibc) nothing happens."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
