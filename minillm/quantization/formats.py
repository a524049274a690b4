"""The weight formats of chapter 14 and their torch references: what each byte means, as the kernels read it.

- int8 per output channel (`quantization="int8"`): row o of W [out, in] is stored as int8 q[o] and one float32
  scale s[o] = max|W[o]| / 127, so W[o] ≈ s[o]·q[o]. Quantized at load from the float32 checkpoint.
- GGUF blocks, llama.cpp's formats, kept as the file has them: each row of W is cut into blocks of 32 weights,
  and each block carries its own float16 scale d (and, for Q4_1, a float16 minimum m) before its values.
  Q8_0: d, then 32 int8, w = d·q (34 bytes). Q4_0: d, then 16 bytes of two 4-bit values each, w = d·(q − 8)
  (18 bytes). Q4_1: d, m, then 16 bytes of 4-bit values, w = d·q + m (20 bytes). In a block's 16 bytes, byte j
  holds weight j in its low four bits and weight j + 16 in its high four bits.

A quantized matmul also quantizes its input on the fly, as llama.cpp does: each row of x in blocks of 32 with one
float16 scale per block (`quantize_activations`). The products of the int8 values are then exact integer sums,
and the scales multiply once per block. `quant_linear_reference` is the function every kernel computes.
"""

import torch

BLOCK = 32  # weights (and activations) per block: one scale each
# the type codes are ggml's (gguf.GGMLQuantizationType); I8, a plain int8 tensor there, is ours with row scales
Q4_0, Q4_1, Q8_0, I8 = 2, 3, 8, 24
BLOCK_BYTES = {Q8_0: 2 + BLOCK, Q4_0: 2 + BLOCK // 2, Q4_1: 4 + BLOCK // 2}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", I8: "int8"}


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: (q, scale) with weight[o] ≈ scale[o] · q[o].

    weight: float [out, in]. scale: float32 [out], max |weight[o]| / 127 for each row (1.0 for a row of zeros, so
    that nothing divides by zero). q: int8 [out, in], round(weight / scale[:, None]) (torch.round: halves to even),
    within -127..127. Returns (q, scale). The tests check the example below, that every row's largest weight maps
    to ±127, that dequantize_int8 brings each weight back within half a scale step, and that the engine's greedy
    tokens with quantization="int8" match its own naive loop.

    Example: weight [[0.5, -1.0, 0.25]] gives scale [1/127] and q [[64, -127, 32]] (63.5 rounds to 64).
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 14.1: per-channel int8 quantize — a scale per row from its largest weight, then round
    amax = weight.abs().amax(dim=1).float()
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(weight.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale
    # END EXERCISE


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weights an int8 tensor stands for: q [out, in] times its row scales [out]."""
    return q.float() * scale[:, None]


def half(raw: torch.Tensor) -> torch.Tensor:
    """Two bytes per value (little-endian float16), [..., 2], as float32 [...]."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """Q8_0 rows, uint8 [rows, blocks · 34], as float32 [rows, blocks · 32]: d · q for each block."""
    blocks = raw.view(*raw.shape[:-1], -1, BLOCK_BYTES[Q8_0])
    d, q = half(blocks[..., :2]), blocks[..., 2:].view(torch.int8).float()
    return (d[..., None] * q).flatten(-2)


def dequantize_q4_0(raw: torch.Tensor) -> torch.Tensor:
    """Q4_0 rows, uint8 [rows, blocks · 18], as float32 [rows, blocks · 32]: d · (q − 8) for each block."""
    blocks = raw.view(*raw.shape[:-1], -1, BLOCK_BYTES[Q4_0])
    d, packed = half(blocks[..., :2]), blocks[..., 2:]
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float() - 8
    return (d[..., None] * q).flatten(-2)


def dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    """Q4_1 rows as float32: the unpacking of one 20-byte block format, for every block of every row.

    raw: uint8 [rows, blocks · 20], each block d (float16, bytes 0-1), m (float16, bytes 2-3), then 16 bytes: byte
    j holds value q_j in its low four bits and q_(j+16) in its high four bits. Returns float32 [rows, blocks · 32],
    weight i of a block being d · q_i + m (computed in float32 as (d * q) + m, as the gguf package does). The
    tests compare with gguf.quants.dequantize bit for bit on random rows and on the real SmolLM2 file's tensors,
    and check the example below.

    Example: a block with d = 0.5, m = -1.0 and byte 0 = 0x31 (low 1, high 3) gives weight 0 = 0.5·1 − 1 = -0.5
    and weight 16 = 0.5·3 − 1 = 0.5. View raw as [rows, blocks, 20] first (one block a row of 20 bytes); then
    half(blocks[..., :2]) is every block's d, as float32.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 14.2: unpack Q4_1 — per block d and m, then the low and the high nibbles of 16 bytes
    blocks = raw.view(*raw.shape[:-1], -1, BLOCK_BYTES[Q4_1])
    d, m, packed = half(blocks[..., :2]), half(blocks[..., 2:4]), blocks[..., 4:]
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()
    return (d[..., None] * q + m[..., None]).flatten(-2)
    # END EXERCISE


def dequantize(weight: torch.Tensor, qtype: int, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 matrix [out, in] of a quantized weight of type qtype (I8 with its row scales, or GGUF blocks).
    Each function is looked up by its name when called, so use_impl's swap of one reaches here."""
    if qtype == I8:
        return dequantize_int8(weight, scale)
    if qtype == Q8_0:
        return dequantize_q8_0(weight)
    if qtype == Q4_0:
        return dequantize_q4_0(weight)
    if qtype == Q4_1:
        return dequantize_q4_1(weight)
    raise ValueError(f"no dequantization for type {qtype}: minillm reads {', '.join(NAMES.values())}")


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x [rows, in] (in a multiple of 32) in blocks of 32, as llama.cpp quantizes a matmul's input
    (Q8_0): (q int8 [rows, in], d [rows, in / 32]), x ≈ d · q blockwise. q = round(x · (127 / max|block|)), 0 for
    an all-zero block; d = max|block| / 127 rounded to float16, the precision llama.cpp stores it in (held in a
    float32 tensor). The very arithmetic the kernels do, so that they compute llama.cpp's function."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(-1)
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse[..., None]).to(torch.int8)
    return q.reshape(x.shape), (amax / 127).half().float()


def block_sums(qx: torch.Tensor, qw: torch.Tensor) -> torch.Tensor:
    """The exact integer sums of each block of 32: [rows, out, blocks] int64, sum over k in block b of
    qx[r, k] · qw[o, k] (int8 values, as int64: no overflow, no rounding)."""
    a = qx.long().reshape(qx.shape[0], 1, -1, BLOCK)
    w = qw.long().reshape(1, qw.shape[0], -1, BLOCK)
    return (a * w).sum(-1)


def int8_linear(qx: torch.Tensor, dx: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y = x @ Wᵀ from quantized activations and an int8 weight with row scales, as the kernels compute it.

    qx: int8 [rows, in] with block scales dx, float32 [rows, in / 32] (quantize_activations). qw: int8 [out, in]
    with row scales `scale`, float32 [out] (quantize_int8). Each output is scale[o] · Σ_b dx[r, b] · S[r, o, b],
    where S = block_sums(qx, qw) holds the exact integer dot products of the blocks of 32: the integers sum first,
    and the floats multiply once per block, then once per output. Returns float32 [rows, out] (compute in float64,
    then convert). The tests check the example below, agree with x @ Wᵀ of the dequantized tensors, and compare
    the C++ kernel with this function.

    Example: one block, qx = [[1, 2, 0, ...]] with dx = [[0.5]], qw = [[3, 4, 0, ...]] with scale [0.25]: the
    integer sum is 1·3 + 2·4 = 11, and y = 0.25 · 0.5 · 11 = 1.375.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 14.3: int8 matmul scales — exact block sums, times each block's dx, times each row's scale
    sums = block_sums(qx, qw).double()
    return (scale.double()[None, :] * (sums * dx.double()[:, None, :]).sum(-1)).float()
    # END EXERCISE


def quant_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, qtype: int, scale: torch.Tensor | None = None, bias=None
) -> torch.Tensor:
    """What every quantized matmul kernel computes, in float64: the input quantized blockwise
    (quantize_activations), times the dequantized weight, plus the bias. float32 [rows, out]."""
    qx, dx = quantize_activations(x)
    xq = (qx.double().reshape(x.shape[0], -1, BLOCK) * dx.double()[..., None]).reshape(x.shape)
    y = xq @ dequantize(weight, qtype, scale).double().T
    return (y if bias is None else y + bias.double()).float()
