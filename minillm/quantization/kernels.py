"""The quantized matmul's C++ kernel for the CPU (minillm/kernels/csrc/quant_linear_cpu.cpp), built with the other
CPU kernels by minillm.layers.cpu_kernels: call `cpu_kernels()` first, which builds them.

It computes formats.quant_linear_reference. For a few rows (decode) it quantizes x blockwise to int8 and sums the
products of int8 values exactly in integer lanes, reading each weight byte once: at batch 1 the weight's bytes are
the whole cost, four to seven times fewer than float32's. For many rows (prefill) it dequantizes the weight, a panel
of output rows at a time, and runs the float32 register tile of the packed linear kernel over them. An int8 weight
is packed for it first (pack_int8), as float32 weights are for the float kernel (cpu_kernels.pack_weight).
"""

import torch

from minillm.quantization.formats import BLOCK

GROUP = 4  # int8 rows the kernel reads together (quant_linear_cpu.cpp's GROUP)


def packed_int8_shape(out: int, inputs: int) -> tuple[int, int, int, int]:
    """The shape pack_int8 gives an int8 weight [out, inputs]: [ceil(out / 4), inputs / 32, 4, 32]."""
    return -(-out // GROUP), inputs // BLOCK, GROUP, BLOCK


def pack_int8(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """An int8 weight [out, in] as the kernel reads it: its rows in groups of four, block by block, so that element
    [g, b, j] is block b (32 values) of row 4·g + j. A group's bytes are one run, as a row's were, and a decode step
    loads each block of x once for four rows. Zero rows pad `out` to a multiple of 4. Written into `out` when given
    (a view of the method's weight mapping)."""
    rows, inputs = q.shape
    shape = packed_int8_shape(rows, inputs)
    padded = torch.zeros(shape[0] * GROUP, inputs, dtype=q.dtype) if rows % GROUP else q
    if padded is not q:
        padded[:rows] = q
    grouped = padded.view(shape[0], GROUP, shape[1], BLOCK).transpose(1, 2)
    return grouped.contiguous() if out is None else out.copy_(grouped)


def packed_int8_rows(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` [n] of the int8 weight that pack_int8 packed, as [n, in]: a tied embedding looks its rows up here."""
    return packed[ids // GROUP, :, ids % GROUP].flatten(1)


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
    flattened and kept: for qtype I8 the int8 weight [out, in] packed by pack_int8 with its float32 row scales
    `scale`, for Q8_0, Q4_0 and Q4_1 the uint8 GGUF blocks [out, in / 32 · block bytes]; in a multiple of 32."""
    y = torch.ops.minillm_cpu.quant_linear(
        x.reshape(-1, x.shape[-1]).contiguous(), weight, scale, bias, qtype, out_features
    )
    return y.view(*x.shape[:-1], out_features)


def quant_isa() -> str:
    """The instruction set the kernel was compiled for: "avx512_vnni" (512-bit integer dot products, where torch's
    capability is AVX-512), "avx2" or "scalar"."""
    return torch.ops.minillm_cpu.quant_isa()
