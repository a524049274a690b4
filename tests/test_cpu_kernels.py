"""The CPU kernels (minillm.kernels.cpu): paged decode attention against the torch reference on random
scattered caches, the KV store against the torch stores, the few-row matmul against F.linear; the engine on them
against the naive loop; the torch path when they cannot be built."""

import pytest
import torch

from minillm import platforms
from minillm.config import Config
from minillm.kernels.cpu import (
    cpu_kernels,
    decode_attention_cpu,
    linear_cpu,
    linear_packed,
    paged_decode_attention_cpu,
    store_kvcache_cpu,
)
from minillm.kernels.packing import embed_packed, empty_packed, pack_weight, pack_weights, panel_width
from minillm.layers import linear_method
from minillm.layers.attention.backends import CPUAttentionBackend, cpu
from minillm.layers.attention.paged_attention import paged_decode_attention, store_decode_kvcache, store_kvcache
from minillm.layers.linear import LinearBase
from minillm.layers.linear_method import PackedLinearMethod, UnquantizedLinearMethod
from minillm.platforms import select_platform
from minillm.utils.context import Context

if not cpu_kernels():
    pytest.skip("the CPU kernels could not be built here (see the warning)", allow_module_level=True)


def random_batch(lens, block_size, heads, kv_heads, head_dim, seed=0):
    """q, caches and block tables for sequences of `lens` keys: blocks drawn in random order (tables scattered and
    non-monotonic), tables -1 padded and sliced from a wider buffer as the model runner does, q a strided view."""
    g = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in lens]
    num_blocks = sum(widths) + 3
    perm, tables, used = torch.randperm(num_blocks, generator=g), torch.full((len(lens), max(widths) + 2), -1), 0
    for i, w in enumerate(widths):
        tables[i, :w] = perm[used : used + w]
        used += w
    k_cache, v_cache = (torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g) for _ in range(2))
    q = torch.randn(len(lens), heads + 3, head_dim, generator=g)[:, :heads]
    return q, k_cache, v_cache, tables[:, : max(widths)], torch.tensor(lens)


def counting(calls: list, kernel):
    """`kernel`, noting each call in `calls`."""
    return lambda *args, **kwargs: calls.append(1) or kernel(*args, **kwargs)


LENS = {
    8: [1, 8, 9, 1030, 23],
    16: [1, 16, 17, 1100, 40],
    32: [1, 32, 33, 1031, 70],  # 1, a block, past it, long
    256: [1, 256, 257, 1100, 130],
}  # blocks longer than the kernel's softmax chunk (128 tokens)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 4), (8, 2), (6, 2)], ids=["mha", "gqa2", "gqa4", "gqa3"])
@pytest.mark.parametrize("head_dim", [32, 64, 128, 20])  # 20: no specialised kernel, a partial last vector
@pytest.mark.parametrize("block_size", [8, 16, 32, 256])
def test_kernel_equals_torch_reference(heads, kv_heads, head_dim, block_size):
    q, k_cache, v_cache, tables, lens = random_batch(LENS[block_size], block_size, heads, kv_heads, head_dim)
    scale = head_dim**-0.5
    expected = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
    out = paged_decode_attention_cpu(q, k_cache, v_cache, tables, lens, scale)
    assert out.shape == expected.shape and out.dtype == torch.float32
    assert (out - expected).abs().max() < 1e-5


def test_kernel_reads_nothing_past_the_context():
    """NaN in every slot past each context (the end of its last block, unused blocks) leaves the output finite."""
    q, k_cache, v_cache, tables, lens = random_batch([5, 16, 17, 40], 16, 8, 2, 32)
    expected = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2)
    used = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for row, n in zip(tables.tolist(), lens.tolist()):
        for j in range(n):
            used[row[j // 16], j % 16] = True
    k_cache[~used], v_cache[~used] = float("nan"), float("nan")
    out = paged_decode_attention_cpu(q, k_cache, v_cache, tables, lens, 0.2)
    assert (out - expected).abs().max() < 1e-5


def test_large_scores_do_not_overflow():
    q, k_cache, v_cache, tables, lens = random_batch([300, 7], 16, 4, 2, 64)
    expected = paged_decode_attention(q * 30, k_cache, v_cache, tables, lens, 1.0)
    assert (paged_decode_attention_cpu(q * 30, k_cache, v_cache, tables, lens, 1.0) - expected).abs().max() < 1e-5


def test_an_opaque_op_under_torch_compile():
    q, k_cache, v_cache, tables, lens = random_batch([3, 50], 16, 8, 2, 32)
    compiled = torch.compile(paged_decode_attention_cpu, fullgraph=True, backend="eager")
    torch.testing.assert_close(
        compiled(q, k_cache, v_cache, tables, lens, 0.3),
        paged_decode_attention_cpu(q, k_cache, v_cache, tables, lens, 0.3),
    )


@pytest.mark.parametrize("kv_heads,head_dim", [(4, 64), (1, 20)])
@pytest.mark.parametrize("is_prefill", [True, False], ids=["prefill", "decode"])
def test_store_kvcache_equals_the_torch_stores(kv_heads, head_dim, is_prefill):
    """A prefill's slot -1 (a cached key) writes nothing; a decode step's (a padded row) the spare last slot."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(9, 3 * kv_heads, head_dim, generator=g)  # k and v as the model has them: views of one qkv
    k, v = qkv[:, kv_heads : 2 * kv_heads], qkv[:, 2 * kv_heads :]
    k_cache, v_cache = (torch.randn(6, 4, kv_heads, head_dim, generator=g) for _ in range(2))
    slots = torch.tensor([0, 22, 5, -1, 6, 7, 12, 1, 9]) if is_prefill else torch.tensor([0, 22, 5, -1])
    k, v = k[: len(slots)], v[: len(slots)]
    expected_k, expected_v, last = k_cache.clone(), v_cache.clone(), k_cache[-1, -1].clone()
    (store_kvcache if is_prefill else store_decode_kvcache)(k, v, expected_k, expected_v, slots)
    store_kvcache_cpu(k, v, k_cache, v_cache, slots, is_prefill)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    assert torch.equal(k_cache[-1, -1], last if is_prefill else k[3])  # the cache's last slot: row 3's slot -1


def test_decode_attention_stores_then_attends():
    """The compiled step's one op: the decode store (a padded row's slot -1 to the spare last slot), then attention
    over the keys including the step's own, as the two kernels one after the other."""
    q, k_cache, v_cache, tables, lens = random_batch([5, 17, 40], 16, 8, 2, 32)
    k, v = torch.randn(2, 3, 2, 32).unbind()
    slots = torch.tensor([int(tables[0, 0]) * 16 + 4, int(tables[1, 1]) * 16, -1])  # each row's newest key; padding
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_kvcache_cpu(k, v, expected_k, expected_v, slots, is_prefill=False)
    expected = paged_decode_attention_cpu(q, expected_k, expected_v, tables, lens, 0.2)
    ctx = Context(slot_mapping=slots, block_tables=tables, context_lens=lens)
    out = decode_attention_cpu(q, k, v, k_cache, v_cache, ctx, 0.2)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v) and torch.equal(out, expected)


def test_store_kvcache_names_a_slot_outside_the_cache():
    k_cache = v_cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(RuntimeError, match="slot 8 of token 1 is outside the cache's 8 slots"):
        store_kvcache_cpu(torch.ones(2, 1, 8), torch.ones(2, 1, 8), k_cache, v_cache, torch.tensor([0, 8]))
    assert not k_cache.any()  # checked before anything is written


def test_backend_takes_the_kernel_and_its_torch_path_without_it(monkeypatch):
    q, k_cache, v_cache, tables, lens = random_batch(list(range(1, 120, 3)), 16, 8, 2, 32)
    ctx = Context(block_tables=tables, context_lens=lens, context_lens_cpu=lens.tolist())
    expected = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.25)
    calls = []
    monkeypatch.setattr(cpu, "paged_decode_attention_cpu", counting(calls, paged_decode_attention_cpu))
    assert (CPUAttentionBackend().decode(q, k_cache, v_cache, ctx, 0.25) - expected).abs().max() < 1e-5 and calls
    monkeypatch.setattr(cpu, "cpu_kernels", lambda: False)  # not built: chunks of decode_rows in torch
    backend, calls[:] = CPUAttentionBackend(), []
    torch.testing.assert_close(backend.decode(q, k_cache, v_cache, ctx, 0.25), expected)
    assert not calls


def test_the_cpu_platform_packs_the_weights_and_without_kernels_keeps_them(monkeypatch):
    assert type(select_platform(Config(), torch.float32).linear_method) is PackedLinearMethod
    model = torch.nn.Sequential(LinearBase(4, 4))
    monkeypatch.setattr(platforms, "cpu_kernels", lambda: False)  # the kernels cannot be built here
    for platform in (
        select_platform(Config(), torch.float32),
        select_platform(Config(native_kernels=False), torch.float32),
    ):
        weight = model[0].weight
        assert type(platform.linear_method) is UnquantizedLinearMethod and not platform.layer_kernels
        platform.prepare_model(model)
        assert model[0].weight is weight and model[0].kernel is None


def test_a_failed_build_warns_once_and_returns_false(monkeypatch):
    def no_ninja(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions (pip install ninja to get it)")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_ninja)
    with pytest.warns(RuntimeWarning, match="could not be built.*Ninja is required.*torch path"):
        assert cpu_kernels.__wrapped__() is False


def test_default_model_on_the_kernel_equals_naive(monkeypatch):
    from minillm import LLM, SamplingParams, default_model_path
    from minillm.data import heldout_openings
    from minillm.models import build_model
    from minillm.naive import generate_naive
    from minillm.tokenizer import Tokenizer

    calls, matmuls, packed_matmuls, stores = [], [], [], []
    monkeypatch.setattr(cpu, "paged_decode_attention_cpu", counting(calls, paged_decode_attention_cpu))
    monkeypatch.setattr(linear_method, "linear_packed", counting(matmuls, linear_packed))
    op = torch.ops.minillm_cpu.linear
    monkeypatch.setattr(torch.ops.minillm_cpu, "linear", counting(packed_matmuls, op))
    monkeypatch.setattr(cpu, "store_kvcache_cpu", counting(stores, store_kvcache_cpu))
    path = default_model_path()
    tok, model = Tokenizer(path), build_model(path)
    prompts = [tok.encode(o) for o in heldout_openings(5)]
    expected = [list(generate_naive(model, p, 48, eos_token_ids=[tok.eos_token_id])) for p in prompts]
    llm = LLM(kvcache_block_size=8)  # short blocks: contexts span several, scattered by the prefix cache's reuse
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected
    assert calls and matmuls and stores
    assert len(packed_matmuls) == len(matmuls)  # every matmul ran on its packed weight, none fell back to F.linear


SHAPES = pytest.mark.parametrize(
    "in_features,out_features",
    [(768, 2048), (21, 67), (256, 1), (8, 130)],
    ids=["large", "odd-inputs", "one-output", "short"],
)


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 6, 7, 13, 100, 301])
@SHAPES
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_linear_equals_f_linear(rows, in_features, out_features, bias):
    """linear_cpu on a packed weight: the matrix-vector kernel for 1 and 2 rows, the register-tiled matmul past
    it: inputs that are and are not a multiple of the unrolled step, whole and short register tiles (6 rows), a
    last panel with fewer than panel_width() outputs, and rows split in several chunks (301 rows of 768 inputs)."""
    g = torch.Generator().manual_seed(rows * in_features + out_features)
    x, w = torch.randn(rows, in_features, generator=g), torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    expected = torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(linear_cpu(x, w, b, pack_weight(w)), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(linear_cpu(x, w, b), expected, rtol=1e-4, atol=1e-4)  # unpacked: F.linear


def test_packed_weights_start_on_a_2_mib_page_boundary():
    """pack_weight's memory is a mapping of its own aligned for transparent huge pages; it outlives the weight."""
    packed = pack_weight(torch.randn(100, 64))
    assert packed.data_ptr() % (2 << 20) == 0 and empty_packed(5, 3).shape == (1, 3, panel_width())


def test_pack_weight_lays_out_panels_of_output_features():
    panel = panel_width()  # two vectors of the instruction set the kernels were built for
    assert panel in (16, 32)
    n = panel + 4  # one whole panel and 4 outputs of the next
    w = torch.arange(n * 3, dtype=torch.float32).view(n, 3)
    packed = pack_weight(w)
    assert packed.shape == (2, 3, panel) and packed.is_contiguous()
    for p in range(2):
        for k in range(3):
            for j in range(panel):
                out = p * panel + j
                assert packed[p, k, j] == (w[out, k] if out < n else 0)


@pytest.mark.parametrize("rows", [1, 4])
def test_linear_rejects_a_weight_not_packed(rows):
    with pytest.raises(RuntimeError, match="packed by packing.pack_weight"):
        torch.ops.minillm_cpu.linear(torch.randn(rows, 8), torch.randn(16, 8), None, 16, 2, 2048)


def test_linear_keeps_leading_dimensions_and_takes_strided_rows():
    x, w = torch.randn(2, 3, 40)[:, :, :32], torch.randn(24, 32)
    packed = pack_weight(w)
    torch.testing.assert_close(linear_cpu(x, w, None, packed), x @ w.T, rtol=1e-4, atol=1e-4)
    assert linear_cpu(x[0, 0], w, None, packed).shape == (24,)


def test_pack_weights_shares_one_mapping_and_equals_pack_weight():
    """Every weight packed as pack_weight packs it alone, side by side in one 2 MiB-aligned mapping (no page per
    weight), each starting on a whole panel."""
    weights = [torch.randn(n, k) for n, k in [(40, 24), (panel_width(), 8), (7, 3)]]
    packed = pack_weights(weights)
    assert packed[0].data_ptr() % (2 << 20) == 0
    for w, p, q in zip(weights, packed, packed[1:] + [None]):
        assert torch.equal(p, pack_weight(w))
        if q is not None:
            assert q.data_ptr() == p.data_ptr() + p.numel() * 4


def test_embed_packed_looks_up_rows_of_the_packed_table():
    table = torch.randn(3 * panel_width() + 5, 16)
    ids = torch.tensor([[0, 5, table.shape[0] - 1], [panel_width(), 1, 1]])
    assert torch.equal(embed_packed(ids, pack_weight(table)), table[ids])


def test_the_engine_keeps_one_copy_of_each_weight():
    """The packed layout replaces the plain weight of every linear layer and of the tied LM head, whose table
    the embedding reads too: no float32 [out, in] weight is left beside a packed one."""
    from minillm import LLM, default_model_path
    from minillm.bench.models import num_parameters

    model = LLM(num_kvcache_blocks=8).model_runner.model
    packed = [m for m in model.modules() if isinstance(m, LinearBase)] + [model.lm_head]
    assert all(m.weight.dim() == 3 and m.weight.shape[2] == panel_width() for m in packed)
    assert model.model.embed_tokens.weight is model.lm_head.weight  # tied: one table
    # the default model's sizes are whole panels: the parameters hold exactly the checkpoint's numbers, once
    assert sum(p.numel() for p in model.parameters()) == num_parameters(default_model_path())


@pytest.mark.parametrize("rows", [1, 3, 64, 300])
@pytest.mark.parametrize("hidden", [576, 64, 37])
def test_norm_kernels_equal_the_torch_functions(rows, hidden):
    """rms_norm and add_rms_norm (both outputs) of minillm.layers.rms_norm, for rows split over the threads and
    a width that is not a whole number of vectors; the inputs are not changed."""
    from minillm.kernels.cpu import norm_cpu
    from minillm.layers.rms_norm import add_rms_norm, rms_norm

    g = torch.Generator().manual_seed(rows + hidden)
    x, res, w = torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g), torch.randn(hidden)
    x0, res0 = x.clone(), res.clone()
    torch.testing.assert_close(norm_cpu(x, None, w, 1e-5), rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    for got, expected in zip(norm_cpu(x, res, w, 1e-5), add_rms_norm(x, res, w, 1e-5)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(x, x0) and torch.equal(res, res0)
    heads = x[:, : hidden - hidden % 8].view(rows, -1, 8)  # a strided view of heads: Qwen3's q/k norm
    torch.testing.assert_close(norm_cpu(heads, None, w[:8], 1e-6), rms_norm(heads, w[:8], 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 3072), (200, 3072), (4, 2, 14)])
def test_silu_and_mul_kernel_equals_the_torch_function(shape):
    from minillm.kernels.cpu import silu_and_mul_cpu
    from minillm.layers.activation import silu_and_mul

    x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0])) * 4
    torch.testing.assert_close(silu_and_mul_cpu(x), silu_and_mul(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens,head_dim", [(1, 64), (130, 64), (5, 36)])
def test_rotary_kernel_equals_the_torch_module(tokens, head_dim):
    """The rotary kernel on q and k views of one packed qkv row per token (as the model splits them), at
    scattered positions, against RotaryEmbedding's torch path; an out-of-range position is refused."""
    from minillm.kernels.cpu import rotary_cpu
    from minillm.layers.rotary import RotaryEmbedding

    rope = RotaryEmbedding(head_dim, 512, 10000.0)
    g = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (9 + 3) * head_dim, generator=g)
    q, k = qkv[:, : 9 * head_dim].view(tokens, 9, head_dim), qkv[:, 9 * head_dim :].view(tokens, 3, head_dim)
    positions = torch.randint(0, 512, (tokens,), generator=g)
    for got, expected in zip(rotary_cpu(positions, q, k, rope.cos_sin_cache), rope(positions, q, k)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="position 512 outside the table"):
        rotary_cpu(torch.full((tokens,), 512), q, k, rope.cos_sin_cache)


def test_the_engine_runs_the_elementwise_kernels():
    """The CPU backend gives every norm, the activation and the rotary embedding its C++ kernel; compiled layers
    (chapter 08) keep the torch functions, which the compiler fuses."""
    from minillm import LLM
    from minillm.layers.activation import SiluAndMul
    from minillm.layers.rms_norm import RMSNorm
    from minillm.layers.rotary import RotaryEmbedding

    model = LLM(num_kvcache_blocks=8).model_runner.model
    layers = [m for m in model.modules() if isinstance(m, (RMSNorm, SiluAndMul, RotaryEmbedding))]
    assert layers and all(m.kernel is not None for m in layers)


def test_the_build_is_named_by_isa_flags_sources_and_cpu(monkeypatch, tmp_path):
    """torch caches extensions by name: builds for another CPU, other flags or other sources get other names."""
    from minillm.kernels import cpu as ck

    name = ck.extension_name("AVX512", ["-O3"])
    assert name.startswith("minillm_cpu_avx512_") and name == ck.extension_name("AVX512", ["-O3"])
    assert ck.extension_name("AVX2", ["-O3"]) != name and ck.extension_name("AVX512", ["-O2"]) != name
    other = tmp_path / "other.cpp"
    other.write_text("// another source")
    monkeypatch.setattr(ck, "SOURCES", [*ck.SOURCES, other])
    assert ck.extension_name("AVX512", ["-O3"]) != name
