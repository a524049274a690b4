"""Decode steps per batch-size bucket (minillm.engine.graphs): bucket choice, padding that touches no cache
slot, and greedy tokens identical to the naive loop across bucket boundaries, with the compiled steps on."""
import pytest
import torch
from checkpoints import make_checkpoint

from minillm import LLM, SamplingParams, default_model_path
from minillm.engine.graphs import decode_buckets, pick_bucket
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
    assert LLM(num_kvcache_blocks=16, enforce_eager=True).model_runner.graph_mode == "eager (enforce_eager=True)"


def test_padded_rows_write_no_cache_slot():
    """Three sequences decode in bucket 4: exactly their three slots change in every layer's cache."""
    llm = LLM(max_num_seqs=4, num_kvcache_blocks=16, enforce_eager=False)
    for prompt in ([5, 6, 7], [8, 9], [10, 11, 12, 13]):
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=4))
    llm.step()  # the prefill of all three
    before = llm.model_runner.kv_cache.clone()  # [2 (k, v), layers, blocks, block_size, kv_heads, head_dim]
    llm.step()  # one decode step, compiled for bucket 4
    assert list(llm.model_runner.graphs.build_seconds) == [4]
    changed = (before != llm.model_runner.kv_cache).flatten(4).any(-1).flatten(2)  # [2, layers, slots]
    assert changed.sum(-1).tolist() == [[3] * changed.shape[1]] * 2


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
    assert [o.token_ids for o in outputs] == [list(generate_naive(base, p, sp.max_tokens)) for p, sp in
                                              zip(prompts, params)]
    assert sorted(llm.model_runner.graphs.build_seconds) == [1, 2, 4, 8]
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)
