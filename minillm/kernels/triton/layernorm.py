"""RMSNorm and the fused residual add + RMSNorm in Triton: one program per row (token).

Eagerly, add + RMSNorm is about six kernels, each reading and writing the whole [tokens, hidden] tensor;
here one program loads its row of x and residual once, writes the new residual and the normalised row, and
is done: the same fusion inductor finds in chapter 08, written by hand. vLLM's names: `rms_norm` and
`fused_add_rms_norm` (which updates its inputs in place; these return new tensors, as minillm's torch
versions in minillm.layers.rms_norm do). `norm` puts the two behind the RMSNorm layer's `kernel` interface.
The module's name is that of vLLM's vllm/model_executor/layers/layernorm.py.
"""

import torch
import triton
import triton.language as tl

from minillm.kernels.triton.common import check_device, jit, kernel_errors


@jit
def rms_norm_kernel(out_ptr, x_ptr, weight_ptr, row_stride, N, eps, BLOCK_N: tl.constexpr):
    """Program r normalises row r of x [rows, N] (row stride row_stride) into out, times weight [N]."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    inside = cols < N
    x = tl.load(x_ptr + row * row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    weight = tl.load(weight_ptr + cols, mask=inside).to(tl.float32)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32) * weight
    tl.store(out_ptr + row * row_stride + cols, normed.to(out_ptr.dtype.element_ty), mask=inside)


@jit
def add_rms_norm_kernel(
    out_ptr, residual_out_ptr, x_ptr, residual_ptr, weight_ptr, row_stride, N, eps, BLOCK_N: tl.constexpr
):
    """Program r: s = x[r] + residual[r]; residual_out[r] = s; out[r] = s / sqrt(mean(s²) + eps) * weight.

    x_ptr, residual_ptr: the sublayer's output and the residual stream, [rows, N] in one float dtype, row r
    starting at r * row_stride; they are only read (the inputs stay unchanged). residual_out_ptr, out_ptr:
    two new tensors of the same shape, dtype and row stride. weight_ptr: [N], one scale per channel. eps:
    a float inside the square root. BLOCK_N: N rounded up to a power of two, so lanes N .. BLOCK_N - 1 are
    masked on every load and store, and must add nothing to the sum of squares (load them as 0).

    Program id 0 (`tl.program_id(0)`) is the row. Add in the inputs' dtype and store that sum as the new
    residual; then, in float32, take the mean of its squares over the N real columns (`tl.sum` over axis 0,
    divided by N, not by BLOCK_N), multiply by `tl.rsqrt` of mean + eps, cast back to the output dtype
    (as the torch rms_norm does), multiply by the weight and store. The tests compare both outputs with the
    torch add_rms_norm to 1e-5 in float32, for N a power of two and not, and a large eps.

    Example, N = 2, x = [1, 2], residual = [2, 2], weight = [1, 1], eps = 0: residual_out = [3, 4], the
    mean of squares is 12.5, out = [0.849, 1.131].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 09.3: fused add + RMSNorm — one program loads its row of x and residual once, stores the sum and its RMSNorm
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offsets = row * row_stride + cols
    total = tl.load(x_ptr + offsets, mask=mask, other=0.0) + tl.load(residual_ptr + offsets, mask=mask, other=0.0)
    tl.store(residual_out_ptr + offsets, total, mask=mask)
    total = total.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(total * total, axis=0) / N + eps)
    scaled = (total * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32) * tl.load(weight_ptr + cols, mask=mask)
    tl.store(out_ptr + offsets, scaled.to(out_ptr.dtype.element_ty), mask=mask)
    # END EXERCISE


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as a contiguous [rows, hidden] tensor (a view when it already is one)."""
    return t.reshape(-1, t.shape[-1]).contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """minillm.layers.rms_norm.rms_norm as one kernel: each vector of x [..., hidden] normalised, times weight."""
    check_device(x, weight)
    rows = _rows(x)
    out = torch.empty_like(rows)
    if rows.numel():
        with kernel_errors():
            rms_norm_kernel[(rows.shape[0],)](
                out, rows, weight, rows.stride(0), rows.shape[1], eps, BLOCK_N=triton.next_power_of_2(rows.shape[1])
            )
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """minillm.layers.rms_norm.add_rms_norm as one kernel: (rms_norm(x + residual), x + residual), inputs unchanged."""
    check_device(x, residual, weight)
    xs, rs = _rows(x), _rows(residual)
    out, new_residual = torch.empty_like(xs), torch.empty_like(xs)
    if xs.numel():
        with kernel_errors():
            add_rms_norm_kernel[(xs.shape[0],)](
                out,
                new_residual,
                xs,
                rs,
                weight,
                xs.stride(0),
                xs.shape[1],
                eps,
                BLOCK_N=triton.next_power_of_2(xs.shape[1]),
            )
    return out.view(x.shape), new_residual.view(x.shape)


def norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """RMSNorm.forward by the Triton kernels (an RMSNorm layer's `kernel`): rms_norm(x, weight, eps) when
    residual is None, else add_rms_norm's pair (normed, new_residual), as minillm.kernels.cpu.norm_cpu."""
    if residual is None:
        return rms_norm(x, weight, eps)
    return add_rms_norm(x, residual, weight, eps)
