"""minillm.kernels.triton equal the torch references under Triton's interpreter on the CPU (or compiled, on CUDA, where
TRITON_INTERPRET=0 is set): the KV-cache store, paged decode attention, RMSNorm and add+RMSNorm, and the
engine on the Triton backend giving the torch backend's greedy tokens. Cases are small: the interpreter runs
every program in Python."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a Triton kernel is defined: before minillm.kernels.triton

import pytest  # noqa: E402
import torch  # noqa: E402

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.config import Config  # noqa: E402
from minillm.engine import input_batch  # noqa: E402
from minillm.engine.graphs import PAD_SLOT_ID  # noqa: E402
from minillm.kernels import triton as kernels  # noqa: E402
from minillm.kernels.cpu import cpu_kernels  # noqa: E402
from minillm.kernels.triton import common  # noqa: E402
from minillm.layers.attention import paged_attention as ref  # noqa: E402
from minillm.layers.attention.backends import select_attention_backend  # noqa: E402
from minillm.layers.linear_method import UnquantizedLinearMethod  # noqa: E402
from minillm.layers.rms_norm import RMSNorm, add_rms_norm, rms_norm  # noqa: E402
from minillm.platforms import select_platform  # noqa: E402

if not kernels.INTERPRET and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is set to something other than 1 and there is no GPU", allow_module_level=True)
DEVICE = "cpu" if kernels.INTERPRET else "cuda"
TOL = dict(atol=1e-5, rtol=1e-5)


def randn(*shape):
    return torch.randn(*shape, device=DEVICE)


@pytest.mark.parametrize("kv_heads,head_dim", [(2, 16), (3, 8)], ids=["D=32", "D=24-not-a-power-of-two"])
def test_store_kvcache_equals_torch_and_skips_slot_minus_one(kv_heads, head_dim):
    torch.manual_seed(0)
    k_cache, v_cache = randn(6, 4, kv_heads, head_dim), randn(6, 4, kv_heads, head_dim)
    # keys and values as the model makes them: views into one qkv tensor, so their rows are strided
    qkv = randn(7, 4 * kv_heads * head_dim)
    k = qkv[:, 2 * kv_heads * head_dim : 3 * kv_heads * head_dim].view(7, kv_heads, head_dim)
    v = qkv[:, 3 * kv_heads * head_dim :].view(7, kv_heads, head_dim)
    slots = torch.tensor([5, 17, -1, 3, 4, -1, 23], device=DEVICE)  # any order, block boundaries, the last slot
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    ref.store_kvcache(k, v, expected_k, expected_v, slots)
    kernels.store_kvcache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_store_kvcache_padded_decode_rows_write_nothing():
    torch.manual_seed(0)
    k_cache, v_cache = randn(3, 4, 2, 8), randn(3, 4, 2, 8)
    k, v = randn(4, 2, 8), randn(4, 2, 8)
    slots = torch.tensor([1, 6, PAD_SLOT_ID, PAD_SLOT_ID], device=DEVICE)  # a batch of 2 padded to 4
    before_k, before_v = k_cache.clone(), v_cache.clone()
    kernels.store_kvcache(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(12, 2, 8), v_cache.view(12, 2, 8)
    assert torch.equal(flat_k[1], k[0]) and torch.equal(flat_k[6], k[1]) and torch.equal(flat_v[6], v[1])
    untouched = [s for s in range(12) if s not in (1, 6)]  # the spare last slot included
    assert torch.equal(flat_k[untouched], before_k.view(12, 2, 8)[untouched])
    assert torch.equal(flat_v[untouched], before_v.view(12, 2, 8)[untouched])


def decode_case(heads, kv_heads, head_dim, block_size, lens):
    """Random q and caches; each sequence's blocks scattered over the cache, tables padded with -1."""
    widths = [-(-n // block_size) for n in lens]
    num_blocks = sum(widths) + 2
    k_cache, v_cache = (
        randn(num_blocks, block_size, kv_heads, head_dim),
        randn(num_blocks, block_size, kv_heads, head_dim),
    )
    order, tables = torch.randperm(num_blocks).tolist(), []
    for w in widths:
        tables.append(order[:w] + [-1] * (max(widths) - w))
        order = order[w:]
    q = randn(len(lens), heads, head_dim)
    return q, k_cache, v_cache, torch.tensor(tables, device=DEVICE), torch.tensor(lens, device=DEVICE)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim", [(4, 4, 16), (8, 2, 16), (6, 2, 24)], ids=["MHA", "GQA", "GQA-group-3-head-dim-24"]
)
@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_decode_attention_equals_torch(heads, kv_heads, head_dim, block_size):
    """Contexts of 1 key, exactly one block, one block and one key, and a partial last block after two full."""
    torch.manual_seed(0)
    lens = [1, block_size, block_size + 1, 2 * block_size + 3]
    q, k_cache, v_cache, tables, context_lens = decode_case(heads, kv_heads, head_dim, block_size, lens)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, context_lens, head_dim**-0.5)
    expected = ref.paged_decode_attention(q, k_cache, v_cache, tables, context_lens, head_dim**-0.5)
    torch.testing.assert_close(out, expected, **TOL)


def test_paged_decode_attention_padded_rows_and_a_full_width_table():
    """A CUDA-graph bucket: two real rows, two PAD rows (context 1, table of zeros), every table column passed."""
    torch.manual_seed(0)
    q, k_cache, v_cache, tables, context_lens = decode_case(8, 2, 16, 4, [7, 3, 1, 1])
    tables = torch.cat([tables, torch.full((4, 3), -1, device=DEVICE)], 1)
    tables[2:] = 0
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, context_lens, 0.25)
    torch.testing.assert_close(out, ref.paged_decode_attention(q, k_cache, v_cache, tables, context_lens, 0.25), **TOL)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("hidden", [64, 48])
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norms_equal_torch(hidden, eps):
    torch.manual_seed(0)
    x, residual, weight = randn(5, hidden), randn(5, hidden), randn(hidden)
    x0, r0 = x.clone(), residual.clone()
    torch.testing.assert_close(kernels.rms_norm(x, weight, eps), rms_norm(x, weight, eps), **TOL)
    heads = x.view(5, -1, 16)  # per-head norm (Qwen3's q_norm / k_norm): the last dimension only
    torch.testing.assert_close(kernels.rms_norm(heads, weight[:16], eps), rms_norm(heads, weight[:16], eps), **TOL)
    normed, new_residual = kernels.add_rms_norm(x, residual, weight, eps)
    expected_normed, expected_residual = add_rms_norm(x, residual, weight, eps)
    assert torch.equal(new_residual, expected_residual)
    torch.testing.assert_close(normed, expected_normed, **TOL)
    assert torch.equal(x, x0) and torch.equal(residual, r0), "the inputs stay unchanged"


def test_rms_norm_layer_with_the_triton_kernel_equals_the_layer_without():
    torch.manual_seed(0)
    layer = RMSNorm(48, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        layer.weight.copy_(randn(48))
    x, residual = randn(5, 48), randn(5, 48)
    expected, (expected_normed, expected_residual) = layer(x), layer(x, residual)
    layer.kernel = kernels.norm  # as the model runner sets it (an instance attribute: the class keeps None)
    torch.testing.assert_close(layer(x), expected, **TOL)
    normed, new_residual = layer(x, residual)
    torch.testing.assert_close(normed, expected_normed, **TOL)
    assert torch.equal(new_residual, expected_residual)


def test_cpu_tensors_without_the_interpreter_raise_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setattr(common, "INTERPRET", False)
    x = torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.rms_norm(x, torch.ones(8), 1e-6)


def test_auto_picks_triton_on_cuda_when_it_compiles_the_cpu_kernel_on_a_cpu_and_torch_otherwise(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert select_attention_backend("auto", "cuda").name == "triton"
    assert select_attention_backend("auto", "cpu").name == "cpu"
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # never the interpreter unasked: it copies the cache every launch
    assert select_attention_backend("auto", "cuda").name == "torch"
    assert select_attention_backend("triton").name == "triton"
    with pytest.raises(ValueError, match="'cpu', 'torch', 'triton'"):
        select_attention_backend("flash")


def test_the_cuda_platform_wires_the_triton_norm_where_triton_compiles(monkeypatch):
    """What a CUDA engine's platform hands its layers, chosen without a GPU: the Triton attention backend and
    RMSNorm kernel where Triton compiles, the plain F.linear, compiled layers and CUDA graphs by default."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    platform = select_platform(Config(device="cuda"), torch.bfloat16)
    assert platform.attention_backend.name == "triton" and platform.layer_kernels == {RMSNorm: kernels.norm}
    assert type(platform.linear_method) is UnquantizedLinearMethod
    assert platform.compile_layers and platform.replays_decode and platform.threads is None
    plain = select_platform(Config(device="cuda", native_kernels=False), torch.bfloat16)
    assert plain.attention_backend.name == "torch" and not plain.layer_kernels
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton would run interpreted: neither the backend nor the norm
    assert not select_platform(Config(device="cuda"), torch.bfloat16).layer_kernels


def test_engine_on_the_triton_backend_gives_the_torch_backends_tokens():
    """The default model, two prompts of different lengths (decode batches of 2, then 1), one block boundary."""
    prompts = ["Once upon a time", "The little fox found a"]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (6, 4)]
    runs = {}
    for backend in ("torch", "triton"):
        llm = LLM(attention_backend=backend, device=DEVICE, kvcache_block_size=4, num_kvcache_blocks=32)
        assert llm.model_runner.platform.attention_backend.name == backend
        runs[backend] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert runs["triton"] == runs["torch"] and [len(t) for t in runs["torch"]] == [6, 4]


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_mixed_steps_give_the_tokens_of_separate_steps(backend, monkeypatch):
    """A prompt is prefilled in chunks while others decode (3 seats, chunks of at most 6 tokens): steps whose first
    rows decode and whose other rows prefill (attention runs the two parts apart) give the tokens separate steps
    give."""
    if backend == "cpu" and not cpu_kernels():
        pytest.skip("the CPU kernels could not be built here")
    mixed_steps = []
    split = input_batch.split_mixed
    monkeypatch.setattr(input_batch, "split_mixed", lambda ctx: mixed_steps.append(ctx.num_decodes) or split(ctx))
    prompts = ["Once upon a time", "The little fox found a", "One day, a girl named Lily went to the park"]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    runs = {}
    for mixed in (True, False):
        llm = LLM(
            attention_backend=backend,
            device=DEVICE,
            kvcache_block_size=4,
            num_kvcache_blocks=64,
            max_num_seqs=3,
            long_prefill_token_threshold=6,
            mixed_steps=mixed,
        )
        runs[mixed] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.block_manager.num_free_blocks == 64
    assert runs[True] == runs[False] and [len(t) for t in runs[True]] == [6, 6, 6]
    assert mixed_steps and max(mixed_steps) == 2  # both seats decoded beside a chunk
