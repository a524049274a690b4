"""The quantized matmul's C++ kernel for the CPU (minillm/kernels/csrc/quant_linear_cpu.cpp), built with the other
CPU kernels by minillm.layers.cpu_kernels: call `cpu_kernels()` first, which builds them.

It computes formats.quant_linear_reference. For a few rows (decode) it quantizes x blockwise to int8 and sums the
products of int8 values exactly in integer lanes, reading each weight byte once: at batch 1 the weight's bytes are
the whole cost, four to seven times fewer than float32's. For many rows (prefill) it dequantizes the weight, a panel
of output rows at a time, and runs the float32 register tile of the packed linear kernel over them.
"""

import torch


def quant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    qtype: int,
    out_features: int,
) -> torch.Tensor:
    """formats.quant_linear_reference(x, weight, qtype, scale, bias) for float32 CPU tensors, x's leading dimensions
    flattened and kept: weight int8 [out, in] with float32 row scales `scale` for qtype I8, or uint8 GGUF blocks
    [out, in / 32 · block bytes] for Q8_0, Q4_0 and Q4_1; in a multiple of 32."""
    y = torch.ops.minillm_cpu.quant_linear(
        x.reshape(-1, x.shape[-1]).contiguous(), weight, scale, bias, qtype, out_features
    )
    return y.view(*x.shape[:-1], out_features)


def quant_isa() -> str:
    """The instruction set the kernel was compiled for: "avx512_vnni" (512-bit integer dot products, where torch's
    capability is AVX-512), "avx2" or "scalar"."""
    return torch.ops.minillm_cpu.quant_isa()
