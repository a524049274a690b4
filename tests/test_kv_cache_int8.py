"""kv_cache_dtype="int8" (chapter 14): keys and values stored as int8 with a float32 scale per token and KV head.

quantize_kv's rules; the stores (torch, C++, Triton under the interpreter) writing the same numbers; decode attention
over an int8 cache within a stated tolerance of the float cache's, and every kernel equal to the torch int8 reference;
the engine with an int8 cache giving its own naive loop's greedy tokens on every scheduling path, and most of the
float engine's; the blocks that fit in the same memory."""

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a Triton kernel is defined: before minillm.kernels.triton

import pytest  # noqa: E402
import torch  # noqa: E402

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.config import Config, ModelConfig  # noqa: E402
from minillm.engine import kv_cache  # noqa: E402
from minillm.kernels import triton as kernels  # noqa: E402
from minillm.kernels.cpu import cpu_kernels, paged_decode_attention_cpu, store_kvcache_cpu  # noqa: E402
from minillm.layers.attention import Attention  # noqa: E402
from minillm.layers.attention import paged_attention as ref  # noqa: E402
from minillm.layers.attention.backends import CPUAttentionBackend, TorchAttentionBackend  # noqa: E402
from minillm.models import build_model  # noqa: E402
from minillm.naive import generate as naive_generate  # noqa: E402  (the module: minillm.naive.generate)
from minillm.naive import generate_cached  # noqa: E402
from minillm.utils.context import Context  # noqa: E402

# Decode attention over an int8 cache against the float cache it was quantized from, unit-normal keys, values and
# queries: each number is off by at most scale / 2 = max|x| / 254 (about 1%), so the outputs by at most ATOL and by
# REL_ERR of their norm. Every kernel against the torch int8 reference: float rounding only (TIGHT).
ATOL, REL_ERR = 0.03, 0.015
TIGHT = dict(atol=1e-5, rtol=1e-5)
TRITON = kernels.INTERPRET or torch.cuda.is_available()
DEVICE = "cpu" if kernels.INTERPRET or not torch.cuda.is_available() else "cuda"  # Triton's; the others run on CPU
GREEDY = SamplingParams(temperature=0, max_tokens=16)


def test_quantize_kv_scales_each_vector_by_its_largest_number():
    x = torch.tensor([[0.5, -1.27, 0.0], [0.0, 0.0, 0.0], [2.54, 1.0, -0.5]])
    q, scale = ref.quantize_kv(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and q.shape == (3, 3) and scale.shape == (3,)
    assert q[0].tolist() == [50, -127, 0] and scale[0].item() == pytest.approx(0.01)
    assert q[1].tolist() == [0, 0, 0] and scale[1].item() == 1.0  # all zero: scale 1, never a division by zero
    assert q[2].tolist() == [127, 50, -25]
    ties = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5])  # scale 1: exact ties round to the even neighbour
    assert ref.quantize_kv(ties)[0].tolist() == [127, 0, 2, 2, 0, -2]


def test_quantize_kv_error_is_at_most_half_a_step_and_clamped():
    torch.manual_seed(0)
    x = torch.randn(64, 4, 32) * torch.rand(64, 4, 1) * 10  # vectors of many sizes
    q, scale = ref.quantize_kv(x)
    assert q.abs().max() == 127 and (q.abs().amax(-1) == 127).all()  # each vector's largest number is ±127
    err = (ref.dequantize_kv(q, scale, torch.float32) - x).abs()
    assert (err <= scale[..., None] / 2 * (1 + 1e-5)).all()
    assert ref.dequantize_kv(q, scale, torch.bfloat16).dtype == torch.bfloat16
    q16, scale16 = ref.quantize_kv(x.bfloat16())  # a 16-bit model's keys: quantized in float32
    assert torch.equal(q16, ref.quantize_kv(x.bfloat16().float())[0]) and scale16.dtype == torch.float32


def random_cache(num_blocks, block_size, kv_heads, head_dim, device="cpu"):
    """Float caches and the int8 caches and scales quantized from them."""
    k, v = (torch.randn(num_blocks, block_size, kv_heads, head_dim, device=device) for _ in range(2))
    (kq, ks), (vq, vs) = ref.quantize_kv(k), ref.quantize_kv(v)
    return (k, v), (kq, vq, ks, vs)


def random_tables(lens, num_blocks, block_size, generator, device="cpu"):
    """Each sequence's blocks, distinct and in random order, -1 padded."""
    width = max(-(-n // block_size) for n in lens)
    tables = torch.full((len(lens), width), -1, dtype=torch.long)
    for i, n in enumerate(lens):
        blocks = -(-n // block_size)
        tables[i, :blocks] = torch.randperm(num_blocks, generator=generator)[:blocks]
    return tables.to(device), torch.tensor(lens, device=device)


# (heads, kv_heads, head_dim, block_size, context lengths): GQA and MHA, head dims with and without a whole vector
DECODE_CASES = {
    "gqa-hd32-bs16": (8, 2, 32, 16, [1, 5, 16, 17, 47, 160]),
    "mha-hd64-bs4": (3, 3, 64, 4, [1, 4, 5, 9, 30]),
    "mqa-hd24-bs8": (4, 1, 24, 8, [2, 8, 9, 63]),
    "gqa-hd128-bs16": (6, 2, 128, 16, [1, 33, 100]),
}


def decode_case(case, device="cpu"):
    heads, kv_heads, head_dim, block_size, lens = DECODE_CASES[case]
    g = torch.Generator().manual_seed(len(lens))
    torch.manual_seed(len(lens))
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    floats, int8 = random_cache(num_blocks, block_size, kv_heads, head_dim, device)
    tables, lens = random_tables(lens, num_blocks, block_size, g, device)
    q = torch.randn(len(lens), heads, head_dim, device=device)
    return q, floats, int8, tables, lens, head_dim**-0.5


def torch_decode(q, kq, vq, ks, vs, tables, lens, scale):
    """The torch backend's decode over an int8 cache: the reference every kernel is held to."""
    return TorchAttentionBackend.paged_decode(q, kq, vq, tables, lens, scale, ks, vs)


def torch_store(k, v, kq, vq, ks, vs, slots, decode=False):
    """The torch backend's store into an int8 cache (a decode step's: slot -1 to the spare last slot)."""
    TorchAttentionBackend().store_kvcache(k, v, kq, vq, Context(is_prefill=not decode, slot_mapping=slots), ks, vs)


def assert_close_to_float(out, expected):
    assert (out - expected).abs().max() < ATOL
    assert (out - expected).norm() < REL_ERR * expected.norm()


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_torch_decode_over_int8_cache_is_close_to_float(case):
    q, (k, v), (kq, vq, ks, vs), tables, lens, scale = decode_case(case)
    out = torch_decode(q, kq, vq, ks, vs, tables, lens, scale)
    assert_close_to_float(out, ref.paged_decode_attention(q, k, v, tables, lens, scale))
    dequantized = ref.dequantize_kv(kq, ks, q.dtype), ref.dequantize_kv(vq, vs, q.dtype)  # the same numbers, exactly
    torch.testing.assert_close(out, ref.paged_decode_attention(q, *dequantized, tables, lens, scale), **TIGHT)


needs_cpu_kernels = pytest.mark.skipif(not cpu_kernels(), reason="the C++ CPU kernels could not be built here")


@needs_cpu_kernels
@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_cpu_kernel_decode_over_int8_cache(case):
    q, (k, v), (kq, vq, ks, vs), tables, lens, scale = decode_case(case)
    out = paged_decode_attention_cpu(q, kq, vq, tables, lens, scale, ks, vs)
    torch.testing.assert_close(out, torch_decode(q, kq, vq, ks, vs, tables, lens, scale), **TIGHT)
    assert_close_to_float(out, ref.paged_decode_attention(q, k, v, tables, lens, scale))


@pytest.mark.skipif(not TRITON, reason="TRITON_INTERPRET is set to something other than 1 and there is no GPU")
@pytest.mark.parametrize("case", ["gqa-hd32-bs16", "mqa-hd24-bs8"])
def test_triton_decode_over_int8_cache(case):
    q, (k, v), (kq, vq, ks, vs), tables, lens, scale = decode_case(case, DEVICE)
    out = kernels.paged_decode_attention(q, kq, vq, tables, lens, scale, ks, vs)
    torch.testing.assert_close(out, torch_decode(q, kq, vq, ks, vs, tables, lens, scale), **TIGHT)
    assert_close_to_float(out, ref.paged_decode_attention(q, k, v, tables, lens, scale))


def store_inputs(kv_heads=3, head_dim=24, num_blocks=5, block_size=4, device="cpu", decode=False):
    """Keys and values strided inside one qkv tensor (as the model makes them), one all-zero key, slots in any order
    with -1 among them (for a decode, once: a padded row, to the spare last slot 19), and caches holding something
    already (to see what is left alone)."""
    torch.manual_seed(0)
    n, d = 9, kv_heads * head_dim
    qkv = torch.randn(n, 4 * d, device=device)
    k, v = qkv[:, 2 * d : 3 * d].view(n, kv_heads, head_dim), qkv[:, 3 * d :].view(n, kv_heads, head_dim)
    k[2] = 0
    slots = torch.tensor([5, 17, 10 if decode else -1, 3, 0, 4, -1, 18 if decode else 19, 8], device=device)
    _, caches = random_cache(num_blocks, block_size, kv_heads, head_dim, device)
    return k, v, slots, caches


def test_torch_store_writes_quantized_keys_and_scales_into_their_slots_only():
    k, v, slots, caches = store_inputs()
    before = [c.clone() for c in caches]
    torch_store(k, v, *caches, slots)
    (kq, ks), (vq, vs) = ref.quantize_kv(k), ref.quantize_kv(v)
    real = slots >= 0
    for cache, old, new in zip(caches, before, (kq, vq, ks, vs)):
        flat, old_flat = cache.flatten(0, 1), old.flatten(0, 1)
        assert torch.equal(flat[slots[real]], new[real])
        untouched = [s for s in range(len(flat)) if s not in slots.tolist()]
        assert torch.equal(flat[untouched], old_flat[untouched])
    k, v, slots, caches = store_inputs(decode=True)  # a decode step: slot -1 is a padded row's, to the spare slot
    torch_store(k, v, *caches, slots, decode=True)
    (kq, ks), _ = ref.quantize_kv(k), ref.quantize_kv(v)
    assert torch.equal(caches[0].flatten(0, 1)[-1], kq[6]) and torch.equal(caches[2].flatten(0, 1)[-1], ks[6])


@needs_cpu_kernels
@pytest.mark.parametrize("is_prefill", [True, False], ids=["prefill", "decode"])
def test_cpu_store_equals_torch_store(is_prefill):
    k, v, slots, caches = store_inputs(decode=not is_prefill)
    expected = [c.clone() for c in caches]
    torch_store(k, v, *expected, slots, decode=not is_prefill)
    kq, vq, ks, vs = caches
    store_kvcache_cpu(k, v, kq, vq, slots, is_prefill, ks, vs)
    assert all(torch.equal(c, e) for c, e in zip(caches, expected))  # bit for bit: the same rounding


@pytest.mark.skipif(not TRITON, reason="TRITON_INTERPRET is set to something other than 1 and there is no GPU")
def test_triton_store_equals_torch_store():
    k, v, slots, caches = store_inputs(device=DEVICE)
    expected = [c.clone() for c in caches]
    torch_store(k, v, *expected, slots)
    kq, vq, ks, vs = caches
    kernels.store_kvcache(k, v, kq, vq, slots, ks, vs)
    assert all(torch.equal(c, e) for c, e in zip(caches, expected))


def test_int8_cache_fits_as_many_more_blocks_as_bytes_per_token_say(tiny_checkpoint):
    config = ModelConfig.from_pretrained(tiny_checkpoint)
    auto, int8 = kv_cache.kv_cache_bytes_per_token(config), kv_cache.kv_cache_int8_bytes_per_token(config)
    layers, kv_heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    assert int8 == 2 * layers * kv_heads * (head_dim + 4) and auto == 2 * layers * kv_heads * head_dim * 4
    budget, block_size = 2**20, 16
    blocks = {
        dtype: LLM(tiny_checkpoint, kv_cache_dtype=dtype, kvcache_memory_bytes=budget).model_runner.num_kvcache_blocks
        for dtype in ("auto", "int8")
    }
    assert blocks == {"auto": budget // (auto * block_size), "int8": budget // (int8 * block_size)}
    assert blocks["int8"] / blocks["auto"] == pytest.approx(auto / int8, rel=0.01)  # 3.56x at head_dim 32


def test_bad_kv_cache_dtype_names_the_options():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, int8, got 'fp8'"):
        Config(kv_cache_dtype="fp8")


def prompts():
    g = torch.Generator().manual_seed(0)
    made = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 40, 33, 3, 32)]
    return made + [made[2] + [1, 2, 3], made[2][:32]]  # shared prefixes, one fully cached


@pytest.fixture(scope="module")
def naive_int8(tiny_checkpoint):
    """Each prompt's greedy tokens from the naive loop alone (chapter 04's contiguous cache), its cache int8."""
    model = build_model(tiny_checkpoint)
    with pytest.MonkeyPatch.context() as m:  # generate_cached allocates its own (float) cache: make it an int8 one
        m.setattr(
            naive_generate, "temporary_kv_cache", functools.partial(kv_cache.temporary_kv_cache, kv_cache_dtype="int8")
        )
        return [list(generate_cached(model, p, GREEDY.max_tokens)) for p in prompts()]


SETTINGS = {  # each with the counter that proves it took its path
    "prefix-cache-hits": ({}, "cached_tokens"),
    "chunked-prefill": (dict(max_num_batched_tokens=20, mixed_steps=False), "chunks"),
    "mixed-steps": (dict(max_num_seqs=3, max_num_batched_tokens=12, long_prefill_token_threshold=5), "mixed"),
    "preemption": (dict(num_kvcache_blocks=16, kvcache_block_size=4, new_token_ratio=0), "preempt"),
    "ngram-drafts": (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3}), None),
}
CASES = [(s, "cpu") for s in SETTINGS] + [("prefix-cache-hits", "torch"), ("preemption", "torch")]


@pytest.mark.parametrize("setting,backend", CASES)
def test_int8_engine_equals_its_naive_loop(tiny_checkpoint, naive_int8, counters, setting, backend):
    """What attention reads is what the cache holds, on every path (a plain prefill reads its own keys dequantized
    too), so an int8 engine computes a prompt alike whole, in chunks, after a cached prefix or after preemption."""
    options, counter = SETTINGS[setting]
    llm = LLM(tiny_checkpoint, kv_cache_dtype="int8", attention_backend=backend, **options)
    assert llm.model_runner.kv_cache.dtype == torch.int8 and llm.model_runner.kv_scales.dtype == torch.float32
    outputs = llm.generate(prompts(), GREEDY, use_tqdm=False)
    assert [out.token_ids for out in outputs] == naive_int8
    assert counter is None or counters[counter] > 0
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


@pytest.mark.skipif(not TRITON, reason="TRITON_INTERPRET is set to something other than 1 and there is no GPU")
def test_int8_engine_on_the_triton_backend_equals_its_naive_loop(tiny_checkpoint, naive_int8):
    llm = LLM(tiny_checkpoint, kv_cache_dtype="int8", attention_backend="triton", device=DEVICE)
    outputs = llm.generate(prompts()[:3], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    assert [out.token_ids for out in outputs] == [tokens[:6] for tokens in naive_int8[:3]]


def test_int8_engine_agrees_with_the_float_engine_on_most_tokens(tiny_checkpoint, naive_int8):
    outputs = LLM(tiny_checkpoint).generate(prompts(), GREEDY, use_tqdm=False)
    same = sum(a == b for out, int8 in zip(outputs, naive_int8) for a, b in zip(out.token_ids, int8))
    assert same >= 0.8 * sum(map(len, naive_int8))


@needs_cpu_kernels
def test_compiled_decode_steps_read_the_int8_cache_through_the_cpu_kernel(tiny_checkpoint, naive_int8, monkeypatch):
    traced = []
    decode_in_graph = CPUAttentionBackend.decode_in_graph

    def spy(self, *args):  # called while dynamo traces a bucket's step: the C++ store-and-attend goes in the graph
        traced.append((out := decode_in_graph(self, *args), args[-2]))
        return out

    monkeypatch.setattr(CPUAttentionBackend, "decode_in_graph", spy)
    llm = LLM(tiny_checkpoint, kv_cache_dtype="int8", enforce_eager=False, max_num_seqs=1)  # one bucket
    outputs = llm.generate(prompts()[:2], GREEDY, use_tqdm=False)
    assert [out.token_ids for out in outputs] == naive_int8[:2]
    assert traced and all(out is not None and k_scale is not None for out, k_scale in traced)  # the int8 cache's


def test_a_borrowed_model_gets_its_int8_cache_back(tiny_checkpoint):
    """temporary_kv_cache (the naive loop's) swaps in a float cache and restores the engine's cache and scales."""
    llm = LLM(tiny_checkpoint, kv_cache_dtype="int8")
    layer = next(m for m in llm.model_runner.model.modules() if isinstance(m, Attention))
    saved = layer.k_cache, layer.v_cache, layer.k_scale, layer.v_scale
    tokens = list(generate_cached(llm.model_runner.model, prompts()[0], 4))
    assert len(tokens) == 4 and all(
        a is b for a, b in zip(saved, (layer.k_cache, layer.v_cache, layer.k_scale, layer.v_scale))
    )
