"""The quantized matmul in Triton (chapter 14): y = x @ Wᵀ + bias for an int8 or GGUF (Q8_0, Q4_0, Q4_1) weight,
read in its stored bytes and dequantized in registers, never in memory.

Why quantize the input too: a block of 32 weights shares one scale, so if the 32 activations it meets share one
scale as well, the block's dot product is a sum of 32 products of small integers, exact in int32 (tensor cores
multiply int8 twice as fast as bfloat16), and the floats enter once per block: d_x · d_w · Σ q_x q_w. Each
program quantizes its rows of x block by block as it goes (amax / 127, round half to even, llama.cpp's Q8_0 for
activations), so one launch does it all; that repeats the cheap quantization once per tile of output features,
against a matmul that does BLOCK_N times more work on the same loads. The function every path computes is
minillm.quantization.formats.quant_linear_reference, and the layouts are described in that module.
vLLM's kernels of this kind are its GGUF `ggml_mul_mat_vec_a8` / `ggml_mul_mat_a8` (ported from llama.cpp's mmvq
and mmq); `quant_linear` has the signature of minillm.quantization.methods.quant_linear_torch.
"""

import torch
import triton
import triton.language as tl

from minillm.kernels.triton.common import check_device, jit, kernel_errors
from minillm.quantization.formats import BLOCK, BLOCK_BYTES, I8, NAMES, Q4_0, Q4_1, Q8_0

# a kernel may read a global only if it is a tl.constexpr: the type codes and the block size, as the kernel sees them
QT_I8, QT_Q8_0, QT_Q4_0, QT_Q4_1 = tl.constexpr(I8), tl.constexpr(Q8_0), tl.constexpr(Q4_0), tl.constexpr(Q4_1)
QK = tl.constexpr(BLOCK)


@jit
def round_half_even(a):
    """a (float32) rounded to the nearest integer, halves to the even one, as torch.round: written out because
    Triton's interpreter cannot run libdevice's rint (an extern call). Every step is exact: floor, and |a| minus
    its floor, so the comparisons with 0.5 see the true fraction; on a GPU this is a handful of instructions."""
    magnitude = tl.abs(a)
    whole = tl.floor(magnitude)
    fraction = magnitude - whole
    odd = (whole.to(tl.int32) & 1) == 1
    whole = tl.where((fraction > 0.5) | ((fraction == 0.5) & odd), whole + 1.0, whole)
    return tl.where(a < 0, -whole, whole)


@jit
def quantize_block(x):
    """One block of 32 activations per row, x float32 [ROWS, 32], to (q int8 [ROWS, 32], d float32 [ROWS]) with
    x ≈ d · q: formats.quantize_activations' arithmetic step for step, so that q is the very same integers (the
    IEEE divisions are div_rn: a plain `/` compiles to an approximate division on NVIDIA GPUs)."""
    amax = tl.max(tl.abs(x), axis=1)
    nonzero = amax > 0
    safe = tl.where(nonzero, amax, 1.0)  # an all-zero block: no division by zero, and inverse 0 makes q 0
    inverse = tl.where(nonzero, tl.math.div_rn(tl.full(safe.shape, 127.0, tl.float32), safe), 0.0)
    q = round_half_even(x * inverse[:, None]).to(tl.int8)
    return q, tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)).to(tl.float16).to(tl.float32)


@jit
def load_half(ptr, mask):
    """The float16 fields at ptr (a uint8 pointer per lane, little-endian), as float32: the two bytes are
    assembled into 16 bits and those bits reinterpreted (a bitcast, not a conversion), at any byte alignment."""
    low = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    high = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@jit
def quant_linear_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    M,
    N,
    num_blocks,
    stride_x,
    stride_w,
    stride_out,
    QTYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (i, j): out[rows, outs] for the BLOCK_M rows i·BLOCK_M … of x [M, in] and the BLOCK_N output
    features j·BLOCK_N … of the weight, over num_blocks = in / 32 blocks of the input.

    Row o of the weight is w_ptr + o·stride_w: int8 values for I8 (BLOCK_BYTES 32, then the row scales at
    scale_ptr), raw ggml blocks of BLOCK_BYTES bytes for GGUF. For each block b: load the rows' 32 activations and
    quantize them (quantize_block); load the weight's block for each output feature as int8 [32, BLOCK_N] (k-major,
    ready for the dot); S = qx @ qw, exact in int32 (tl.dot on int8, 16 × 32 × 16 at least: hence BLOCK_M ≥ 16
    even for one row, the spare rows masked to zero); then acc += S · d_x · d_w in float32. Unpacking a Q4 block:
    its 16 bytes hold weight k in the low nibble of byte k for k < 16, in the high nibble of byte k − 16 for
    k ≥ 16, so lane k loads byte k mod 16 and shifts it right by 4 · (k // 16) before masking 0xF; Q4_0 subtracts
    8 (values −8 … 7). Q4_1's w = d·q + m adds m · d_x · Σ q_x per block. I8's single row scale multiplies once,
    at the end, as formats.int8_linear; then the bias, and the store in the output's dtype.
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, out_ok = rows < M, outs < N
    k = tl.arange(0, QK)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x + k[None, :]  # [BLOCK_M, 32]: block 0 of each row
    w_rows = w_ptr + outs.to(tl.int64) * stride_w  # [BLOCK_N]: the start of each output feature's row
    w_mask = out_ok[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for b in range(0, num_blocks):
        x = tl.load(x_rows + b * QK, mask=row_ok[:, None], other=0.0).to(tl.float32)
        qx, dx = quantize_block(x)
        block = w_rows + b * BLOCK_BYTES  # [BLOCK_N]: block b of each row
        if QTYPE == QT_I8:
            qw = tl.load(block[None, :] + k[:, None], mask=w_mask, other=0)
            acc += tl.dot(qx, qw, out_dtype=tl.int32).to(tl.float32) * dx[:, None]
        else:
            d = load_half(block, out_ok)  # bytes 0-1 of every GGUF block
            if QTYPE == QT_Q8_0:  # bytes 2 … 33: 32 int8 values
                qw = tl.load(block[None, :] + 2 + k[:, None], mask=w_mask, other=0).to(tl.int8, bitcast=True)
            else:  # 16 bytes of nibbles, after d (Q4_0) or after d and m (Q4_1)
                start = 2 if QTYPE == QT_Q4_0 else 4
                packed = tl.load(block[None, :] + start + (k % 16)[:, None], mask=w_mask, other=0).to(tl.int32)
                nibble = (packed >> (4 * (k // 16))[:, None]) & 0xF
                qw = (nibble - 8 if QTYPE == QT_Q4_0 else nibble).to(tl.int8)
            s = tl.dot(qx, qw, out_dtype=tl.int32).to(tl.float32)
            acc += s * (dx[:, None] * d[None, :])
            if QTYPE == QT_Q4_1:  # Σ_k d_x q_x,k · m = m · d_x · Σ q_x
                m = load_half(block + 2, out_ok)
                sum_qx = tl.sum(qx.to(tl.int32), axis=1).to(tl.float32)
                acc += (dx * sum_qx)[:, None] * m[None, :]
    if QTYPE == QT_I8:
        acc *= tl.load(scale_ptr + outs, mask=out_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + outs, mask=out_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_out + outs[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & out_ok[None, :])


def _check(x, weight, scale, bias, qtype, out_features) -> None:
    """Raise an error naming the problem before anything is launched."""
    if qtype not in NAMES:
        raise ValueError(f"quant_linear: unknown qtype {qtype!r}; expected one of {sorted(NAMES)} ({NAMES})")
    name = NAMES[qtype]
    if not x.is_floating_point():
        raise TypeError(f"quant_linear: x must be a float tensor, got {x.dtype}")
    in_features = x.shape[-1]
    if in_features % BLOCK:
        raise ValueError(f"quant_linear: the input size {in_features} is not a multiple of {BLOCK} (the block size)")
    if weight.dim() != 2 or weight.shape[0] != out_features:
        raise ValueError(
            f"quant_linear: the {name} weight must be 2-D with out_features = {out_features} rows, got shape "
            f"{tuple(weight.shape)}"
        )
    if qtype == I8:
        if weight.dtype != torch.int8:
            raise TypeError(f"quant_linear: an int8 (I8) weight must be torch.int8, got {weight.dtype}")
        if weight.shape[1] != in_features:
            raise ValueError(
                f"quant_linear: the int8 weight has {weight.shape[1]} columns, the input size is {in_features}"
            )
        if scale is None or scale.dtype != torch.float32 or scale.shape != (out_features,):
            got = "none" if scale is None else f"{scale.dtype} {tuple(scale.shape)}"
            raise ValueError(f"quant_linear: an int8 weight needs its row scales, float32 [{out_features}]; got {got}")
    else:
        if weight.dtype != torch.uint8:
            raise TypeError(f"quant_linear: a {name} weight must be its raw bytes, torch.uint8, got {weight.dtype}")
        expected = in_features // BLOCK * BLOCK_BYTES[qtype]
        if weight.shape[1] != expected:
            raise ValueError(
                f"quant_linear: the {name} weight has {weight.shape[1]} bytes per row; an input of size "
                f"{in_features} needs {in_features // BLOCK} blocks of {BLOCK_BYTES[qtype]} bytes = {expected}"
            )
    if bias is not None and bias.shape != (out_features,):
        raise ValueError(f"quant_linear: bias must have shape ({out_features},), got {tuple(bias.shape)}")


def quant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    qtype: int,
    out_features: int,
) -> torch.Tensor:
    """formats.quant_linear_reference as one kernel launch, with quant_linear_torch's signature: x [..., in] (in a
    multiple of 32, any float dtype, its leading dimensions flattened) times a weight of type qtype (I8: int8
    [out, in] with float32 row scales `scale`; Q8_0 / Q4_0 / Q4_1: uint8 [out, in / 32 · block bytes]), plus bias
    [out]. Returns [..., out_features] in x's dtype, accumulated in float32."""
    _check(x, weight, scale, bias, qtype, out_features)
    check_device(*(t for t in (x, weight, scale, bias) if t is not None))
    rows = x.reshape(-1, x.shape[-1])
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    scale, bias = (None if t is None else t.contiguous() for t in (scale, bias))  # read as [out], stride 1
    out = torch.empty(rows.shape[0], out_features, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out.view(*x.shape[:-1], out_features)
    m = rows.shape[0]
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64  # tl.dot needs 16 rows: a decode step pads its few
    block_n = 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(out_features, block_n))
    with kernel_errors():
        quant_linear_kernel[grid](
            out,
            rows,
            weight,
            scale if scale is not None else out,  # an unused pointer where the type has no row scales
            bias if bias is not None else out,
            m,
            out_features,
            rows.shape[1] // BLOCK,
            rows.stride(0),
            weight.stride(0),
            out.stride(0),
            QTYPE=qtype,
            BLOCK_BYTES=BLOCK if qtype == I8 else BLOCK_BYTES[qtype],
            HAS_BIAS=bias is not None,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            enable_fp_fusion=False,  # no fused multiply-adds: x · (127 / amax) rounds to float32 before it rounds
        )
    return out.view(*x.shape[:-1], out_features)
