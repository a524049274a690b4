"""Chapter 14 exercises: per-channel int8 quantization (14.1), unpacking GGUF's Q4_1 blocks (14.2) and the
scales of an int8 matmul (14.3).

Each is checked on hand-made inputs, against the gguf package (14.2, bit for bit) or the float product (14.3),
then the engine runs with your code: quantization="int8" (14.1, 14.3's arithmetic is the kernels') and a Q4_1
GGUF file (14.2, whose tied embedding table is looked up through your unpacking) must give the greedy tokens of
their own naive loop.

    python -m minillm.course grade 14
"""

import numpy as np
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.bench.gguf_export import export
from minillm.course import use_impl
from minillm.naive import generate_cached
from minillm.quantization.formats import BLOCK_BYTES, Q4_1, dequantize_int8, quantize_activations

gguf = pytest.importorskip("gguf")
PROMPTS = [[5, 17, 99, 3], [200, 1, 1, 42, 7, 8, 9]]


def greedy(llm) -> list[list[int]]:
    """The engine's greedy tokens for PROMPTS, checked against its own naive loop on the same weights."""
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert outs == [list(generate_cached(llm.model_runner.model, p, 10)) for p in PROMPTS]
    return outs


@pytest.mark.exercise("14.1")
def test_int8_rows_get_their_own_scale(impl):
    q, scale = impl.quantize_int8(torch.tensor([[0.5, -1.0, 0.25], [2.0, 0.0, -0.5]]))
    assert q.dtype == torch.int8, f"q must be int8, got {q.dtype}"
    assert q.tolist() == [[64, -127, 32], [127, 0, -32]], "round(weight / scale): 63.5 rounds to 64, -31.75 to -32"
    torch.testing.assert_close(scale, torch.tensor([1.0, 2.0]) / 127)
    q, scale = impl.quantize_int8(torch.zeros(2, 4))
    assert scale.tolist() == [1.0, 1.0] and q.abs().sum() == 0, "a row of zeros gets scale 1.0 (no division by 0)"


@pytest.mark.exercise("14.1")
def test_int8_error_stays_within_half_a_step(impl):
    weight = torch.randn(32, 64) * torch.rand(32, 1) * 3
    q, scale = impl.quantize_int8(weight)
    assert scale.dtype == torch.float32 and scale.shape == (32,), f"scale: float32 [out], got {scale.shape}"
    assert (q.abs().amax(1) == 127).all(), "each row's largest weight maps to ±127"
    assert ((dequantize_int8(q, scale) - weight).abs() <= scale[:, None] / 2 + 1e-6).all()


@pytest.mark.exercise("14.1")
def test_the_engine_runs_on_your_int8_weights(impl, tiny_checkpoint):
    expected = greedy(LLM(tiny_checkpoint, quantization="int8", skip_tokenizer_init=True))
    with use_impl(impl, "14.1"):
        llm = LLM(tiny_checkpoint, quantization="int8", skip_tokenizer_init=True)
        head_dtype = llm.model_runner.model.lm_head.weight.dtype
        assert head_dtype == torch.int8
        assert greedy(llm) == expected, "the engine on your int8 weights gives other tokens than on the reference's"


def q4_1_block(d: float, m: float, values: list[int]) -> np.ndarray:
    """One Q4_1 block's 20 bytes: d and m as float16, then value j in byte j's low nibble, value j+16 in its high."""
    packed = np.array([values[j] | values[j + 16] << 4 for j in range(16)], dtype=np.uint8)
    return np.concatenate([np.array([d, m], dtype=np.float16).view(np.uint8), packed])


@pytest.mark.exercise("14.2")
def test_q4_1_low_nibbles_first_then_high(impl):
    values = [1] + [0] * 15 + [3] + [15] * 15
    raw = torch.from_numpy(q4_1_block(0.5, -1.0, values)[None])
    w = impl.dequantize_q4_1(raw)
    assert w.shape == (1, 32) and w.dtype == torch.float32, f"one row of 32 float32 weights, got {w.shape} {w.dtype}"
    assert w[0, 0] == -0.5 and w[0, 16] == 0.5, "weight 0 = 0.5·1 − 1 (low nibble), weight 16 = 0.5·3 − 1 (high)"
    assert w[0, 1:16].tolist() == [-1.0] * 15 and w[0, 17:].tolist() == [6.5] * 15


@pytest.mark.exercise("14.2")
def test_q4_1_rows_match_the_gguf_package_bit_for_bit(impl):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 96)).astype(np.float32) * 2
    raw = gguf.quants.quantize(weight, Q4_1)
    assert raw.shape == (16, 3 * BLOCK_BYTES[Q4_1])
    ours = impl.dequantize_q4_1(torch.from_numpy(raw)).numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), gguf.quants.dequantize(raw, Q4_1).view(np.uint32))


@pytest.mark.exercise("14.2")
def test_a_q4_1_file_runs_through_your_unpacking(impl, tiny_checkpoint, tmp_path):
    file = export(tiny_checkpoint, tmp_path, "q4_1")
    expected = greedy(LLM(file, skip_tokenizer_init=True))
    with use_impl(impl, "14.2"):
        llm = LLM(file, skip_tokenizer_init=True)
        table_type = llm.model_runner.model.model.embed_tokens.qtype
        assert table_type == Q4_1, "the tied table looks rows up as Q4_1"
        assert greedy(llm) == expected, "looked up through your unpacking, the embeddings give other tokens"


@pytest.mark.exercise("14.3")
def test_int8_linear_sums_integers_then_scales(impl):
    qx, qw = torch.zeros(1, 32, dtype=torch.int8), torch.zeros(2, 32, dtype=torch.int8)
    qx[0, :2], qw[0, :2], qw[1, 31] = torch.tensor([1, 2]), torch.tensor([3, 4]), 127
    qx[0, 31] = -127
    y = impl.int8_linear(qx, torch.tensor([[0.5]]), qw, torch.tensor([0.25, 1.0]))
    assert y.dtype == torch.float32 and y.shape == (1, 2), f"float32 [rows, out], got {y.dtype} {tuple(y.shape)}"
    assert y.tolist() == [[1.375, -8064.5]], "0.25 · 0.5 · (1·3 + 2·4); 1.0 · 0.5 · (−127 · 127)"


@pytest.mark.exercise("14.3")
def test_int8_linear_uses_each_blocks_own_scale(impl):
    x, w = torch.randn(3, 96) * torch.tensor([1.0, 50.0, 0.01]).repeat_interleave(32), torch.randn(8, 96)
    qx, dx = quantize_activations(x)
    assert dx.shape == (3, 3)
    amax = w.abs().amax(1)
    qw, scale = torch.round(w / (amax[:, None] / 127)).to(torch.int8), amax / 127
    y = impl.int8_linear(qx, dx, qw, scale)
    exact = (qx.double().view(3, 3, 32) * dx.double()[..., None]).view(3, 96) @ (
        qw.double() * scale.double()[:, None]
    ).T
    torch.testing.assert_close(y, exact.float(), rtol=1e-5, atol=1e-4)
