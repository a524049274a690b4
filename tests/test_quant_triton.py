"""minillm.kernels.triton.quant_linear, the Triton quantized matmul of chapter 14, equals formats.quant_linear_reference
for int8 (I8) and GGUF Q8_0, Q4_0, Q4_1 weights, under Triton's interpreter on the CPU (or compiled, on CUDA, where
TRITON_INTERPRET=0 is set). Its input quantization is checked bit for bit against formats.quantize_activations,
halves to even included. Cases are small: the interpreter runs every program in Python.

Tolerance: the kernel's block sums are exact integers, and what follows is a few float32 roundings per block
(d_x · d_w, times the sum, the accumulation, Q4_1's minimum term, the row scale, the bias), where the reference
works in float64. So each output must be within 1e-5 of the sum of its terms' magnitudes, |x̂| @ |Ŵ|ᵀ + |bias|
(x̂, Ŵ: the quantized input and the dequantized weight): some twenty float32 roundings' worth; the kernel is
typically within a few. A wrong quantized activation, off by one step, is off by d_x · |w|, far beyond that.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a Triton kernel is defined: before minillm.kernels.triton

import pytest  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

from minillm.kernels.triton import common  # noqa: E402
from minillm.kernels.triton.common import jit  # noqa: E402
from minillm.kernels.triton.quant_linear import quant_linear, quantize_block  # noqa: E402
from minillm.quantization import formats  # noqa: E402
from minillm.quantization.formats import BLOCK, I8, NAMES, Q4_0, Q4_1, Q8_0  # noqa: E402

if not common.INTERPRET and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is set to something other than 1 and there is no GPU", allow_module_level=True)
DEVICE = "cpu" if common.INTERPRET else "cuda"
QTYPES = [I8, Q8_0, Q4_0, Q4_1]
RELATIVE = 1e-5  # of |x̂| @ |Ŵ|ᵀ + |bias|: see the module's docstring


def quantized_weight(weight: torch.Tensor, qtype: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight as stored, its row scales or None): formats.quantize_int8 for I8, the gguf package for GGUF."""
    if qtype == I8:
        return formats.quantize_int8(weight)
    return torch.from_numpy(gguf_quantize(weight.numpy(), GGMLQuantizationType(qtype))), None


def run(x, weight, scale, bias, qtype, out_features):
    """The kernel on DEVICE, its result back on the CPU."""
    moved = [None if t is None else t.to(DEVICE) for t in (x, weight, scale, bias)]
    return quant_linear(*moved, qtype=qtype, out_features=out_features).cpu()


def assert_matches_reference(y, x, weight, qtype, scale=None, bias=None):
    """y (float32 [rows, out]) within RELATIVE of the reference, relative to the sum of the terms' magnitudes."""
    expected = formats.quant_linear_reference(x, weight, qtype, scale, bias).double()
    qx, dx = formats.quantize_activations(x)
    xq = (qx.double().view(x.shape[0], -1, BLOCK) * dx.double()[..., None]).view(x.shape)
    magnitude = xq.abs() @ formats.dequantize(weight, qtype, scale).double().abs().T
    if bias is not None:
        magnitude += bias.double().abs()
    error = (y.double() - expected).abs()
    worst = (error / magnitude.clamp_min(1e-30)).max().item()
    assert (error <= RELATIVE * magnitude).all(), f"{NAMES[qtype]}: an error of {worst:.2e} of the magnitude"


@pytest.mark.parametrize("out_features", [1, 40])
@pytest.mark.parametrize("in_features", [64, 96])
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("qtype", QTYPES, ids=[NAMES[t] for t in QTYPES])
def test_quant_linear_equals_the_reference(qtype, rows, in_features, out_features):
    """Random inputs, weights and bias; 17 rows take two row tiles, 40 outputs leave most of a tile masked."""
    torch.manual_seed(rows * 1000 + in_features + out_features)
    x, weight, bias = torch.randn(rows, in_features), torch.randn(out_features, in_features), torch.randn(out_features)
    stored, scale = quantized_weight(weight, qtype)
    y = run(x, stored, scale, bias, qtype, out_features)
    assert y.shape == (rows, out_features) and y.dtype == torch.float32
    assert_matches_reference(y, x, stored, qtype, scale, bias)


@pytest.mark.parametrize("qtype", QTYPES, ids=[NAMES[t] for t in QTYPES])
def test_blocks_of_zeros_quantize_to_zero_and_a_zero_row_gives_the_bias(qtype):
    torch.manual_seed(1)
    x, weight, bias = torch.randn(3, 96), torch.randn(40, 96), torch.randn(40)
    x[0, 32:64] = 0  # one block of zeros inside a row
    x[1] = 0  # a whole row of zeros
    x[2, :32] = 0
    stored, scale = quantized_weight(weight, qtype)
    y = run(x, stored, scale, bias, qtype, 40)
    assert_matches_reference(y, x, stored, qtype, scale, bias)
    assert torch.equal(y[1], bias) and torch.isfinite(y).all()


@jit
def quantize_rows_kernel(q_ptr, d_ptr, x_ptr, BLOCKS: tl.constexpr):
    """Program r quantizes row r of x [rows, BLOCKS · 32] block by block, as quant_linear_kernel does."""
    row = tl.program_id(0)
    blocks, k = tl.arange(0, BLOCKS), tl.arange(0, 32)
    offsets = row * BLOCKS * 32 + blocks[:, None] * 32 + k[None, :]
    q, d = quantize_block(tl.load(x_ptr + offsets))
    tl.store(q_ptr + offsets, q)
    tl.store(d_ptr + row * BLOCKS + blocks, d)


def test_the_input_is_quantized_bit_for_bit_as_quantize_activations_halves_to_even():
    """Blocks whose largest value is 127 make 127 / amax exactly 1, so ±0.5, ±1.5, ±2.5 … are exact halves: they
    must round to the even neighbour, as torch.round does. Then random blocks, tiny and large ones, zeros."""
    torch.manual_seed(2)
    halves = torch.arange(-15.5, 16.0, 1.0)  # 32 exact halves
    ties = torch.cat([torch.tensor([127.0]), halves[:31]])
    x = torch.stack(
        [
            torch.cat([ties, -ties]),
            torch.cat([ties * 0.5, ties * 4]),  # amax 63.5 and 508: x · 127 / amax hits the halves again
            torch.cat([torch.randn(32), torch.zeros(32)]),
            torch.cat([torch.randn(32) * 1e-3, torch.randn(32) * 1e3]),
        ]
    )
    q, d = torch.empty(4, 64, dtype=torch.int8, device=DEVICE), torch.empty(4, 2, device=DEVICE)
    with common.kernel_errors():
        quantize_rows_kernel[(4,)](q, d, x.to(DEVICE), BLOCKS=2, enable_fp_fusion=False)
    expected_q, expected_d = formats.quantize_activations(x)
    assert torch.equal(q.cpu(), expected_q) and torch.equal(d.cpu(), expected_d)
    assert torch.equal(expected_q[0, 1:8], torch.tensor([-16, -14, -14, -12, -12, -10, -10], dtype=torch.int8))


def test_leading_dimensions_no_bias_and_a_half_precision_input():
    torch.manual_seed(3)
    x, weight = torch.randn(2, 3, 64), torch.randn(40, 64)
    stored, _ = quantized_weight(weight, Q4_1)
    y = run(x, stored, None, None, Q4_1, 40)
    assert y.shape == (2, 3, 40)
    assert_matches_reference(y.view(6, 40), x.view(6, 64), stored, Q4_1)
    half = run(x.half(), stored, None, None, Q4_1, 40)  # accumulated in float32, stored in x's dtype
    assert half.dtype == torch.float16
    expected = formats.quant_linear_reference(x.half().view(6, 64), stored, Q4_1)
    torch.testing.assert_close(half.view(6, 40).float(), expected, rtol=2e-3, atol=2e-3)
    empty = run(torch.randn(0, 64), stored, None, None, Q4_1, 40)
    assert empty.shape == (0, 40)


def test_bad_inputs_raise_errors_naming_the_problem():
    x, weight = torch.randn(2, 64), torch.randn(40, 64)
    q4, _ = quantized_weight(weight, Q4_0)
    q8, scale = quantized_weight(weight, I8)
    cases = [
        (dict(x=torch.randn(2, 48), weight=q4, qtype=Q4_0), ValueError, "input size 48 is not a multiple of 32"),
        (dict(x=x.long(), weight=q4, qtype=Q4_0), TypeError, "x must be a float tensor"),
        (dict(x=x, weight=q4[:, :20], qtype=Q4_0), ValueError, "20 bytes per row.*needs 2 blocks of 18 bytes = 36"),
        (dict(x=x, weight=q4, qtype=Q8_0), ValueError, "Q8_0 weight has 36 bytes per row"),
        (dict(x=x, weight=weight, qtype=Q4_1), TypeError, "Q4_1 weight must be its raw bytes, torch.uint8"),
        (dict(x=x, weight=q8, qtype=I8), ValueError, "needs its row scales"),
        (dict(x=x, weight=q8, scale=scale.double(), qtype=I8), ValueError, "needs its row scales, float32"),
        (dict(x=x, weight=q8.view(torch.uint8), scale=scale, qtype=I8), TypeError, "must be torch.int8"),
        (dict(x=x, weight=q4, qtype=Q4_0, out_features=41), ValueError, "out_features = 41 rows"),
        (dict(x=x, weight=q4, bias=torch.zeros(4), qtype=Q4_0), ValueError, r"bias must have shape \(40,\)"),
        (dict(x=x, weight=q4, qtype=99), ValueError, "unknown qtype 99"),
    ]
    for kwargs, error, message in cases:
        kwargs.setdefault("out_features", 40)
        with pytest.raises(error, match=message):
            quant_linear(**kwargs)


def test_cpu_tensors_without_the_interpreter_raise_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setattr(common, "INTERPRET", False)
    q4, _ = quantized_weight(torch.randn(8, 32), Q4_0)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        quant_linear(torch.randn(2, 32), q4, qtype=Q4_0, out_features=8)
