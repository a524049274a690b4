"""The quantized matmul's C++ kernel (minillm.kernels.cpu: quant_linear_cpu.cpp) against what it must compute,
formats.quant_linear_reference: within float rounding on random int8 and GGUF weights, to the bit where every
product and sum is exact in float too, through both of its paths (the integer kernel up to 64 rows of x, the
dequantized float32 panels past it); its errors; and its AVX2 build on a machine with AVX-512."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from minillm.kernels.cpu import cpu_kernels, quant_isa, quant_linear
from minillm.kernels.packing import pack_int8, packed_int8_rows, packed_int8_shape
from minillm.quantization import formats
from minillm.quantization.formats import BLOCK, BLOCK_BYTES, I8, NAMES, Q4_0, Q4_1, Q8_0

if not cpu_kernels():
    pytest.skip("the CPU kernels could not be built here (see the warning)", allow_module_level=True)

QTYPES = [I8, Q8_0, Q4_0, Q4_1]
RTOL = 1e-5  # max |kernel − reference| ≤ RTOL · max |reference|: float32 sums of exact block products
# (rows, in, out): 1-4 rows share each weight load, 5-64 come back to it, 65 and 300 take the panels; in 32 and 96
# end on an odd block (the 512-bit kernel takes two a step), out 1, 17, 100 end on a short panel
SHAPES = [(1, 32, 1), (1, 1536, 100), (2, 96, 17), (3, 576, 64), (4, 1536, 17), (5, 96, 100), (7, 576, 1),
          (16, 1536, 64), (64, 96, 17), (65, 576, 100), (300, 1536, 17), (300, 32, 64)]  # fmt: skip


def random_weight(qtype: int, out: int, inputs: int, seed: int):
    """(weight, scale) for qtype from standard normal weights: quantize_int8, or the gguf package's quantize."""
    w = np.random.default_rng(seed).standard_normal((out, inputs), dtype=np.float32)
    if qtype == I8:
        return formats.quantize_int8(torch.from_numpy(w))
    return torch.from_numpy(quantize(w, GGMLQuantizationType(qtype))), None


def kernel(x, weight, scale=None, bias=None, *, qtype, out_features):
    """quant_linear on a weight as the reference takes it: an int8 one packed first, as the int8 method stores it."""
    weight = pack_int8(weight) if qtype == I8 else weight
    return quant_linear(x, weight, scale, bias, qtype=qtype, out_features=out_features)


@pytest.mark.parametrize("out", [1, 4, 6, 17])
def test_pack_int8_groups_rows_block_by_block(out):
    """Element [g, b, j] of the packed weight is block b of row 4g + j; rows come back by id; padding is zeros."""
    q = torch.randint(-127, 128, (out, 96), dtype=torch.int8)
    packed = pack_int8(q)
    assert packed.shape == packed_int8_shape(out, 96) == (-(-out // 4), 3, 4, 32)
    for row in range(out):
        assert torch.equal(packed[row // 4, 2, row % 4], q[row, 64:])
    assert torch.equal(packed_int8_rows(packed, torch.arange(out).flip(0)), q.flip(0))
    padding = torch.arange(packed.shape[0] * 4) >= out
    assert not packed.transpose(1, 2).flatten(0, 1)[padding].any()


@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("rows,inputs,out", SHAPES, ids=[f"{r}x{i}x{o}" for r, i, o in SHAPES])
@pytest.mark.parametrize("qtype", QTYPES, ids=[NAMES[q] for q in QTYPES])
def test_kernel_equals_the_reference(qtype, rows, inputs, out, bias):
    weight, scale = random_weight(qtype, out, inputs, seed=rows + out)
    g = torch.Generator().manual_seed(inputs)
    x, b = torch.randn(rows, inputs, generator=g), torch.randn(out, generator=g) if bias else None
    expected = formats.quant_linear_reference(x, weight, qtype, scale, b)
    y = kernel(x, weight, scale, b, qtype=qtype, out_features=out)
    assert y.shape == (rows, out) and y.dtype == torch.float32
    assert (y - expected).abs().max() <= RTOL * expected.abs().max()


def exact_weight(qtype: int, out: int, inputs: int, g: torch.Generator):
    """(weight, scale) whose every scale (and Q4_1 minimum) is ±2^k, k in -1..1, and values small: |q| ≤ 15."""
    blocks = inputs // BLOCK

    def powers(*shape):
        return 2.0 ** torch.randint(-1, 2, shape, generator=g)

    if qtype == I8:
        return torch.randint(-15, 16, (out, inputs), generator=g).to(torch.int8), powers(out)
    q = torch.randint(-15, 16, (out, blocks, BLOCK), generator=g, dtype=torch.int8).view(torch.uint8)
    if qtype != Q8_0:  # 4-bit values, two to a byte: value j low, value j + 16 high
        nib = torch.randint(0, 16, (out, blocks, BLOCK), generator=g, dtype=torch.uint8)
        q = nib[..., :16] | nib[..., 16:] << 4
    d = powers(out, blocks, 1)
    if qtype == Q4_1:  # then m, of either sign
        d = torch.cat([d, powers(out, blocks, 1) * (torch.randint(0, 2, (out, blocks, 1), generator=g) * 2 - 1)], -1)
    raw = torch.cat([d.half().view(torch.uint8), q], dim=-1)
    assert raw.shape[-1] == BLOCK_BYTES[qtype]
    return raw.reshape(out, -1).contiguous(), None


def exact_activations(rows: int, inputs: int, g: torch.Generator) -> torch.Tensor:
    """x whose every block is ±2^k (k in -1..1) times integers with largest magnitude 127, so that it quantizes to
    exactly those integers with scale 2^k; and some all-zero blocks, one in every 5, and all of row 0 when rows > 1."""
    x = torch.randint(-126, 127, (rows, inputs // BLOCK, BLOCK), generator=g).float()
    x[..., 0] = 127 * (torch.randint(0, 2, x.shape[:2], generator=g) * 2 - 1)
    x = x * 2.0 ** torch.randint(-1, 2, (*x.shape[:2], 1), generator=g)
    x[:, ::5] = 0
    if rows > 1:
        x[0] = 0
    return x.reshape(rows, inputs)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 64, 65, 300])
@pytest.mark.parametrize("qtype", QTYPES, ids=[NAMES[q] for q in QTYPES])
def test_exact_integer_sums(qtype, rows):
    """Scales that are powers of two and products whose sums stay below 2^24 units (256 inputs · 127 · 15 · 4, in
    quarters): every integer sum, scale product and float sum is exact, so the kernel equals the reference bit for
    bit, zero blocks and a zero row included (their q and scale are 0, and nothing divides by zero)."""
    g = torch.Generator().manual_seed(rows)
    weight, scale = exact_weight(qtype, 40, 256, g)
    x, bias = exact_activations(rows, 256, g), torch.randint(-8, 9, (40,), generator=g) / 4
    y = kernel(x, weight, scale, bias, qtype=qtype, out_features=40)
    assert torch.equal(y, formats.quant_linear_reference(x, weight, qtype, scale, bias))
    assert rows == 1 or torch.equal(y[0], bias)


def adversarial_block(rng: np.random.Generator) -> np.ndarray:
    """32 floats where the exact arithmetic of quantize_activations shows: torch computes 127 / amax as (1 / amax)
    · 127, which differs from 127 / amax correctly rounded for this amax, and value 1 rounds to another integer
    under the two."""
    one, c127 = np.float32(1), np.float32(127)
    while True:
        amax = np.float32(rng.uniform(0.5, 4))
        inverse, correct = one / amax * c127, c127 / amax
        for k in rng.permutation(120)[:20] if inverse != correct else []:
            v = np.float32((k + 0.5) / inverse)
            for _ in range(8):
                if np.round(v * inverse) != np.round(v * correct):
                    block = (rng.uniform(-0.9, 0.9, BLOCK) * amax).astype(np.float32)
                    block[0], block[1] = amax, v
                    return block
                v = np.nextafter(v, np.float32(np.inf))


@pytest.mark.parametrize("rows", [1, 65])
def test_activations_are_quantized_to_the_bit(rows):
    """With an identity int8 weight (scale 1) output i is x's quantized value d · q at i, one product, rounded once:
    the kernel equals the reference bit for bit on random blocks and on blocks built so that a differently rounded
    127 / amax would round a value to another integer (and halves round to even)."""
    rng = np.random.default_rng(rows)
    blocks = np.concatenate([rng.standard_normal((rows * 4, BLOCK), dtype=np.float32)]
                            + [adversarial_block(rng)[None] for _ in range(rows * 4)])  # fmt: skip
    x = torch.from_numpy(blocks).view(rows, -1)
    x[0, :BLOCK] = torch.cat([torch.tensor([127.0]), torch.arange(-15.5, 15)])  # inverse 1: the halves to even
    eye = torch.eye(x.shape[1], dtype=torch.int8)
    y = kernel(x, eye, torch.ones(x.shape[1]), qtype=I8, out_features=x.shape[1])
    assert torch.equal(y, formats.quant_linear_reference(x, eye, I8, torch.ones(x.shape[1])))


@pytest.mark.parametrize("qtype", QTYPES, ids=[NAMES[q] for q in QTYPES])
def test_threads_split_the_outputs_and_the_rows(qtype):
    """On two threads: the integer kernel's output rows in two runs, and with one panel (17 outputs) the rows of x
    in two chunks; the same results as on one."""
    weight, scale = random_weight(qtype, 17, 576, seed=qtype)
    x = torch.randn(300, 576, generator=torch.Generator().manual_seed(0))
    one = [kernel(x[:n], weight, scale, qtype=qtype, out_features=17) for n in (3, 300)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = [kernel(x[:n], weight, scale, qtype=qtype, out_features=17) for n in (3, 300)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


def test_keeps_leading_dimensions_and_takes_strided_rows():
    weight, _ = random_weight(Q4_0, 9, 64, seed=0)
    x = torch.randn(2, 3, 128)[..., ::2]
    y = kernel(x, weight, qtype=Q4_0, out_features=9)
    assert y.shape == (2, 3, 9)
    assert torch.equal(y.view(6, 9), kernel(x.reshape(6, 64), weight, qtype=Q4_0, out_features=9))


def test_an_opaque_op_with_a_fake_for_torch_compile():
    weight, _ = random_weight(Q8_0, 5, 64, seed=0)
    torch.library.opcheck(
        torch.ops.minillm_cpu.quant_linear.default,
        (torch.randn(3, 64), weight, None, None, Q8_0, 5),
        test_utils=("test_schema", "test_faketensor"),
    )


def bad(x=None, weight=None, scale=None, bias=None, qtype=Q4_0, out=4, inputs=64):
    """quant_linear with one argument wrong, the rest a valid Q4_0 call (an int8 one for qtype I8)."""
    x = torch.randn(2, inputs) if x is None else x
    if weight is None:
        weight = (torch.zeros(packed_int8_shape(out, inputs), dtype=torch.int8) if qtype == I8
                  else torch.zeros(out, 36, dtype=torch.uint8))  # fmt: skip
    return torch.ops.minillm_cpu.quant_linear(x, weight, scale, bias, qtype, out)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: bad(x=torch.randn(2, 64, dtype=torch.float64)), "float32 CPU x"),
        (lambda: bad(x=torch.randn(2, 48), weight=torch.zeros(4, 27, dtype=torch.uint8)), r"in \(48\) must be a mult"),
        (lambda: bad(qtype=7), "unknown qtype 7"),
        (lambda: bad(weight=torch.zeros(4, 64, dtype=torch.int8)), "qtype 2 is a contiguous Byte"),
        (lambda: bad(weight=torch.zeros(4, 34, dtype=torch.uint8)), r"bytes do not match.*\[4, 36\]"),
        (lambda: bad(weight=torch.zeros(4, 36, dtype=torch.uint8), qtype=Q8_0), r"bytes do not match.*\[4, 68\]"),
        (lambda: bad(out=5, weight=torch.zeros(4, 36, dtype=torch.uint8)), "bytes do not match"),
        (lambda: bad(qtype=I8, weight=torch.zeros(4, 64, dtype=torch.int8)), r"packed .*pack_int8.*\[1, 2, 4, 32\]"),
        (lambda: bad(qtype=I8), "row scales"),
        (lambda: bad(qtype=I8, scale=torch.ones(3)), "row scales"),
        (lambda: bad(bias=torch.ones(4, dtype=torch.float64)), "bias"),
    ],
    ids=[
        "x-dtype",
        "in",
        "qtype",
        "weight-dtype",
        "q4-bytes",
        "q8-bytes",
        "out",
        "int8-unpacked",
        "no-scale",
        "scale-size",
        "bias",
    ],
)
def test_bad_inputs_name_the_problem(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def cpu_flags() -> set[str]:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    return set(next((line for line in lines if line.startswith("flags")), "").split())


def test_isa_is_the_widest_the_build_allows():
    expected = "avx512_vnni" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "avx2"
    if expected == "avx512_vnni" and not {"avx512_vnni", "avx512bw"} <= cpu_flags():
        expected = "avx2"
    if "avx2" not in cpu_flags():
        expected = "scalar"
    assert quant_isa() == expected


AVX2_CHECK = """
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from minillm.kernels.cpu import cpu_kernels
from minillm.quantization import formats
from minillm.kernels.cpu import quant_isa, quant_linear
from minillm.kernels.packing import pack_int8
assert cpu_kernels()
print(quant_isa())
for qtype in (formats.I8, formats.Q8_0, formats.Q4_1):
    if qtype == formats.I8:  # 38 rows: the last group of four has two
        weight, scale = formats.quantize_int8(torch.randn(38, 96))
        stored = pack_int8(weight)
    else:
        weight = stored = torch.from_numpy(quantize(torch.randn(38, 96).numpy(), GGMLQuantizationType(qtype)))
        scale = None
    for rows in (1, 2, 3, 70):
        x = torch.randn(rows, 96)
        y = quant_linear(x, stored, scale, qtype=qtype, out_features=38)
        ref = formats.quant_linear_reference(x, weight, qtype, scale)
        assert (y - ref).abs().max() <= 1e-5 * ref.abs().max(), (qtype, rows)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif("avx2" not in cpu_flags(), reason="this CPU has no AVX2")
def test_the_avx2_build_runs_the_avx2_kernel():
    """ATEN_CPU_CAPABILITY=avx2 (torch's own switch, read at start-up) builds the extension for AVX2 (a build of its
    own, named by the level): on an AVX-512 machine too the 256-bit kernel is compiled, and equals the reference."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    run = subprocess.run([sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["avx2", "ok"]
