"""Decode steps per batch-size bucket (minillm.engine.graphs): bucket choice, padding that touches no cache
slot, and greedy tokens identical to the naive loop across bucket boundaries, with the compiled steps on."""

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from checkpoints import make_checkpoint
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from minillm import LLM, SamplingParams, default_model_path
from minillm.engine.graphs import PAD_SLOT_ID, decode_buckets, pick_bucket
from minillm.kernels.cpu import cpu_kernels
from minillm.layers.attention.paged_attention import paged_decode_attention, store_decode_kvcache, store_kvcache
from minillm.models import build_model
from minillm.naive import generate_naive


def test_buckets_are_powers_of_two_then_steps_of_16():
    assert decode_buckets(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert decode_buckets(20) == [1, 2, 4, 8, 16]
    assert decode_buckets(3) == [1, 2]


@pytest.mark.parametrize("batch, bucket", [(1, 1), (3, 4), (8, 8), (9, 16), (16, 16), (17, 32), (20, None)])
def test_the_smallest_bucket_that_holds_the_batch(batch, bucket):
    assert pick_bucket(decode_buckets(20 if bucket is None else 32), batch) == bucket


def test_eager_by_default_on_cpu_and_the_engine_says_why():
    assert LLM(num_kvcache_blocks=16).model_runner.graph_mode.startswith("eager (the CPU default")
    assert LLM(num_kvcache_blocks=16).model_runner.graph_mode.endswith("layers eager")
    assert (
        LLM(num_kvcache_blocks=16, enforce_eager=True, compile_layers=True).model_runner.graph_mode
        == "eager (enforce_eager=True); layers compiled"
    )


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_padded_rows_write_no_cache_slot(backend):
    """Three sequences decode in bucket 4: exactly their three slots change in every layer's cache, and the
    padded row writes only into the spare block at the end, which the block manager never hands out."""
    if backend == "cpu" and not cpu_kernels():
        pytest.skip("the CPU kernels could not be built here")
    llm = LLM(max_num_seqs=4, num_kvcache_blocks=16, enforce_eager=False, attention_backend=backend)
    for prompt in ([5, 6, 7], [8, 9], [10, 11, 12, 13]):
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=4))
    llm.step()  # the prefill of all three
    before = llm.model_runner.kv_cache.clone()  # [2 (k, v), layers, blocks, block_size, kv_heads, head_dim]
    llm.step()  # one decode step, compiled for bucket 4
    assert list(llm.model_runner.graphs.build_seconds) == [4]
    changed = (before != llm.model_runner.kv_cache).flatten(4).any(-1)  # [2, layers, blocks, block_size]
    assert changed.shape[2] == len(llm.block_manager.blocks) + 1
    real, spare = changed[:, :, :-1].flatten(2), changed[:, :, -1]
    assert real.sum(-1).tolist() == [[3] * real.shape[1]] * 2
    assert spare.sum(-1).tolist() == [[1] * real.shape[1]] * 2  # the padded row, in the spare block's last slot


def test_a_compiled_step_replays_without_dynamo():
    """Once a bucket is built, its steps call inductor's compiled code directly: dynamo checks no guards (its
    cache lookup would show in the profile), and the tokens stay the eager engine's."""
    llm, eager = LLM(enforce_eager=False), LLM()
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.generate([[5, 6, 7]], greedy, use_tqdm=False)  # builds bucket 1
    with torch.profiler.profile() as prof:
        out = llm.generate([[8, 9, 10, 11]], greedy, use_tqdm=False)
    names = {event.key for event in prof.key_averages()}
    attention = "minillm_cpu::decode_attention" if cpu_kernels() else "minillm::attention"  # in the graph, or opaque
    assert attention in names and not [name for name in names if "Dynamo" in name]
    assert sorted(llm.model_runner.graphs.steps) == [1]
    assert out[0].token_ids == eager.generate([[8, 9, 10, 11]], greedy, use_tqdm=False)[0].token_ids


def test_named_capture_sizes_are_compiled_at_start_and_larger_batches_run_op_by_op(capsys):
    """cudagraph_capture_sizes=[1] (what the chat and the server run with): bucket 1 is built before any request,
    with a line that says so; a batch of 3 has no bucket and runs eagerly; the tokens are the eager engine's."""
    llm, eager = LLM(enforce_eager=False, cudagraph_capture_sizes=[1]), LLM()
    graphs = llm.model_runner.graphs
    assert graphs.buckets == [1] and list(graphs.build_seconds) == [1]
    assert "minillm: compiling the decode step for batch sizes [1]" in capsys.readouterr().err
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    assert [o.token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)] == [
        o.token_ids for o in eager.generate(prompts, greedy, use_tqdm=False)
    ]
    assert list(graphs.build_seconds) == [1] and graphs.bucket_for(3) is None
    with pytest.raises(ValueError, match=r"cudagraph_capture_sizes must be a non-empty list of batch sizes from 1"):
        LLM(num_kvcache_blocks=16, max_num_seqs=8, cudagraph_capture_sizes=[16])


def test_a_deleted_compiled_engine_is_freed():
    """Dynamo keeps every compiled version (and its backend) for the life of the process; the engine's KV cache
    and weights must not live on with it."""

    def run():
        llm = LLM(enforce_eager=False)
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
        assert llm.model_runner.graphs.steps
        return weakref.ref(llm.model_runner.kv_cache)

    kv_cache = run()
    gc.collect()
    assert kv_cache() is None


def test_each_engine_adds_its_buckets_to_the_recompile_limit():
    """Dynamo keeps one list of compiled versions per function, shared by every engine of a process: two
    compiled engines of 8 buckets each need 16 versions of the same forward (fullgraph: past the limit, a
    decode step would fail)."""
    with torch._dynamo.config.patch(recompile_limit=8):  # dynamo's default, restored after
        engines = [LLM(max_num_seqs=64, enforce_eager=False) for _ in range(3)]
        assert [len(e.model_runner.graphs.buckets) for e in engines] == [8, 8, 8]
        assert torch._dynamo.config.recompile_limit == 8 + 3 * 8


@pytest.fixture(scope="module")
def oracle_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-gqa-tied")
    make_checkpoint("qwen3-gqa-tied", path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("model", ["default", "oracle"])
def test_compiled_decode_equals_naive_across_bucket_boundaries(model, oracle_path):
    """Nine requests ending one after another: decode batches of 9 (more than the largest bucket: eager), 8 (a
    bucket), 5 to 7 (padded to 8), 3 (padded to 4), 2 and 1, each request's tokens those it gets alone."""
    path = default_model_path() if model == "default" else oracle_path
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 9, 17, 5, 12, 30, 7, 21, 3)]
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(9)]
    llm = LLM(path, max_num_seqs=9, enforce_eager=False)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    base = build_model(path)
    assert [o.token_ids for o in outputs] == [
        list(generate_naive(base, p, sp.max_tokens)) for p, sp in zip(prompts, params)
    ]
    assert sorted(llm.model_runner.graphs.build_seconds) == [1, 2, 4, 8]
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["default", "oracle"])
def test_compiled_layers_equal_naive(model, oracle_path):
    """The layers' hot functions compiled (RMSNorm, add+RMSNorm, rotary, SiLU-and-mul): the same greedy tokens
    as the naive loop, over prefills and decode batches of several sizes, without a compile per batch size."""
    path = default_model_path() if model == "default" else oracle_path
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (6, 19, 3, 11, 25)]
    params = [SamplingParams(temperature=0, max_tokens=2 + 3 * i, ignore_eos=True) for i in range(5)]
    llm = LLM(path, compile_layers=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    base = build_model(path)
    assert [o.token_ids for o in outputs] == [
        list(generate_naive(base, p, sp.max_tokens)) for p, sp in zip(prompts, params)
    ]
    # each function was compiled for one token or row (sizes 0 and 1 are always specialised) and for "any
    # other number": steps of new sizes compile nothing more
    compiled = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    llm.generate([p[:4] + p for p in prompts[:3]], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled


def data_dependent_sizes(fn, *args) -> set:
    """The sizes in fn's traced graph that depend on the values of its inputs (unbacked symbols, u0, u1...):
    each is a number the host must read back from the device before it can go on."""
    graph = make_fx(fn, tracing_mode="symbolic")(*args)
    vals = [n.meta.get("val") for n in graph.graph.nodes]
    return set().union(*(free_unbacked_symbols(v) for v in vals if isinstance(v, torch.Tensor)))


def test_the_decode_store_and_attention_depend_on_no_value_read_back():
    """What a CUDA graph needs, checked on a CPU: traced symbolically, the decode step's cache store and paged
    attention have no size that depends on the data (the padded row writes the spare slot instead of being
    masked out), and they give the eager result. The prefill store's mask, slot_mapping >= 0, picks a
    data-dependent number of rows: a sync no graph can record."""
    torch.manual_seed(0)
    k_cache, v_cache = torch.zeros(2, 6, 4, 2, 8).unbind(0)  # 5 blocks and the spare one, block_size 4
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots, tables = torch.tensor([5, 13, PAD_SLOT_ID]), torch.tensor([[0, 1], [2, 3], [0, 0]])
    lens = torch.tensor([6, 6, 1])

    def step(q, k, v, k_cache, v_cache, slots, tables, lens):
        store_decode_kvcache(k, v, k_cache, v_cache, slots)
        return paged_decode_attention(q, k_cache, v_cache, tables, lens, 8**-0.5)

    assert data_dependent_sizes(step, q, k, v, k_cache, v_cache, slots, tables, lens) == set()
    assert data_dependent_sizes(store_kvcache, k, v, k_cache, v_cache, slots)  # the mask's row count
    out = step(q, k, v, k_cache, v_cache, slots, tables, lens)
    assert torch.equal(k_cache.view(-1, 2, 8)[[5, 13, -1]], k)  # the padded row wrote the spare last slot
    seq0 = torch.cat([k_cache[0], k_cache[1]])[:6]
    expected = F.scaled_dot_product_attention(
        q[0, :, None],
        seq0.transpose(0, 1).repeat_interleave(2, 0),
        torch.cat([v_cache[0], v_cache[1]])[:6].transpose(0, 1).repeat_interleave(2, 0),
        scale=8**-0.5,
    )[:, 0]
    torch.testing.assert_close(out[0], expected)
