"""Paged decode attention on the CPU as a small C++ kernel that reads the KV cache in place (vLLM's CPU backend
does the same): minillm/kernels/csrc/paged_attention_cpu.cpp.

The torch path (`paged_decode_attention`) first copies every sequence's blocks into a padded tensor, then runs
SDPA over it: each key is moved twice, and the padding is computed and masked. The kernel instead walks each
sequence's block table, one task per (sequence, KV head) on all cores, with an online softmax over the blocks.

It is compiled on first use by torch.utils.cpp_extension (a C++ compiler and ninja; -march=native, so built for
this machine), once: the build is cached in torch's extensions directory. Where it cannot be built,
`cpu_decode_kernel` says why in one warning and returns None, and callers keep the torch path.
"""
import functools
import os
import shutil
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).parents[1] / "kernels" / "csrc" / "paged_attention_cpu.cpp"


@functools.cache
def cpu_decode_kernel():
    """`paged_decode_attention_cpu` once its extension is built and loaded, or None (with one warning) if it
    cannot be. Registered as the custom op minillm_cpu::paged_decode_attention, so torch.compile keeps it
    opaque."""
    try:
        from torch.utils.cpp_extension import load
        if shutil.which("ninja") is None:  # the ninja wheel's binary, when the environment's bin is not on PATH
            import ninja
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        isa = torch.backends.cpu.get_cpu_capability()  # at::vec's instruction set, as torch's own kernels pick it
        flags = ["-O3", "-march=native", "-fopenmp", f"-DCPU_CAPABILITY={isa}", f"-DCPU_CAPABILITY_{isa}"]
        load("minillm_paged_attention_cpu", [str(SOURCE)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
             is_python_module=False)
    except Exception as e:  # no compiler, no ninja, a failed build: the engine runs on without the kernel
        lines = str(e).splitlines() or [repr(e)]  # a failed build: its first line is the command, then the errors
        reason = next((line for line in lines[1:] if "error" in line), lines[0])[:300]
        warnings.warn(f"minillm: the CPU paged-attention kernel could not be built ({type(e).__name__}: {reason}); "
                      "decode attention takes the slower torch path", RuntimeWarning, stacklevel=2)
        return None
    torch.library.register_fake("minillm_cpu::paged_decode_attention")(lambda q, *args: torch.empty_like(q))
    return paged_decode_attention_cpu


def paged_decode_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """minillm.layers.paged_attention.paged_decode_attention for float32 CPU tensors, read in place: same
    arguments, same result (to float rounding). Every context_lens[i] must be ≥ 1; table entries past a
    sequence's context (the -1 padding) are never read. Call `cpu_decode_kernel()` first, which builds it."""
    return torch.ops.minillm_cpu.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
