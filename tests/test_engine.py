"""The engine against the naive generator: every scheduling path gives token-identical greedy output."""

import pytest
import torch
from checkpoints import CONFIGS, make_checkpoint

from minillm import LLM, SamplingParams
from minillm.bench.stall import stall_probe, summarize
from minillm.models import build_model
from minillm.naive import generate_cached, generate_naive, generate_static

GREEDY = SamplingParams(temperature=0, max_tokens=24)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
SETTINGS = {
    "default": {},
    "chunked-prefill": dict(max_num_batched_tokens=20),
    "preemption": dict(num_kvcache_blocks=24, kvcache_block_size=4),
    "no-prefix-cache": dict(enable_prefix_caching=False),
    # later prompts join while others decode (3 seats), in chunks of at most 5 tokens
    "mixed-steps": dict(max_num_seqs=3, max_num_batched_tokens=12, long_prefill_token_threshold=5),
    "separate-steps": dict(mixed_steps=False, max_num_batched_tokens=20),
    # speculative decoding (chapter 13): drafts by prompt lookup, some kept and some rolled back
    "ngram": dict(speculative_config=NGRAM),
    "ngram-preemption": dict(num_kvcache_blocks=24, kvcache_block_size=4, speculative_config=NGRAM),
    # drafts cut to what the token budget leaves, beside prompt chunks
    "ngram-mixed-steps": dict(max_num_seqs=3, max_num_batched_tokens=12, speculative_config=NGRAM),
}


def make_prompts():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 40, 33, 64, 3, 16, 32)]
    return prompts + [prompts[4] + [1, 2, 3], prompts[4][:32]]  # shared prefixes, one fully cached


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """name -> (checkpoint dir, greedy tokens of each prompt generated alone by the naive loop), made once."""
    made = {}

    def get(name):
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            make_checkpoint(name, path)
            model = build_model(path)
            made[name] = path, [list(generate_naive(model, p, GREEDY.max_tokens)) for p in make_prompts()]
        return made[name]

    return get


# every architecture with the default settings and with speculation; every setting on one (scheduling ignores the
# architecture)
CASES = [(name, s) for name in sorted(CONFIGS) for s in ("default", "ngram")] + [
    ("qwen3-gqa-tied", s) for s in sorted(SETTINGS) if s not in ("default", "ngram")
]


@pytest.mark.parametrize("name,setting", CASES)
def test_batched_greedy_equals_naive_one_at_a_time(reference, name, setting, counters):
    path, expected = reference(name)
    llm = LLM(path, **SETTINGS[setting])
    outputs = llm.generate(make_prompts(), GREEDY, use_tqdm=False)
    assert [out.token_ids for out in outputs] == expected
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)  # nothing leaked
    assert_exercised(setting, counters, llm)


def assert_exercised(setting, counters, llm):
    """Each setting really took its path: chunks, preemptions, prefix-cache hits (or none without the cache)."""
    expected = {
        "chunked-prefill": "chunks",
        "separate-steps": "chunks",
        "preemption": "preempt",
        "ngram-preemption": "preempt",
        "default": "cached_tokens",
        "mixed-steps": "mixed",
    }.get(setting)
    if expected:
        assert counters[expected] > 0
    if setting == "no-prefix-cache":
        assert counters["cached_tokens"] == 0
    if setting == "separate-steps":
        assert counters["mixed"] == 0
    if "speculative_config" in SETTINGS[setting]:  # drafts were kept, and others rolled back
        assert 0 < llm.spec_stats.num_accepted_tokens < llm.spec_stats.num_draft_tokens


def test_a_decoding_request_preempts_a_partly_prefilled_one_and_generate_finishes(reference):
    """The configuration that failed a whole generate() with "the scheduler found nothing to run" before partial
    prefills were running requests: the short request's decode must preempt the long prompt part-way through its
    chunks, and every request still gets its greedy tokens, with a prefix-cache hit on the recomputation."""
    path, _ = reference("qwen3-gqa-tied")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 256, (n,), generator=g).tolist() for n in (4, 32)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (20, 4)]
    llm = LLM(path, kvcache_block_size=4, num_kvcache_blocks=10, max_num_batched_tokens=4, new_token_ratio=0.0)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    model = build_model(path)
    assert [o.token_ids for o in outputs] == [
        list(generate_naive(model, p, sp.max_tokens)) for p, sp in zip(prompts, params)
    ]
    assert llm.scheduler.num_preemptions > 0 and llm.block_manager.num_free_blocks == 10


def test_a_preempted_request_comes_back_through_the_prefix_cache_with_its_tokens(reference):
    """Two requests share a 16-token prefix; the cache is too small for both to grow, so the later one is preempted.
    Recomputed, it finds its prefix (and its own full blocks) in the prefix cache, and its tokens are unchanged."""
    path, _ = reference("qwen3-gqa-tied")
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(1, 256, (16,), generator=g).tolist()
    prompts = [prefix + [5, 6], prefix + [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    llm = LLM(path, kvcache_block_size=4, num_kvcache_blocks=11, new_token_ratio=0.0)
    seqs = [llm.add_request(p, params) for p in prompts]
    preempted = []
    preempt = llm.scheduler.preempt
    llm.scheduler.preempt = lambda seq: preempted.append(seq) or preempt(seq)
    while not llm.is_finished():
        llm.step()
    model = build_model(path)
    assert [s.completion_token_ids for s in seqs] == [list(generate_naive(model, p, 14)) for p in prompts]
    assert preempted and all(s.num_cached_tokens >= len(prefix) for s in preempted), "recomputed from the cache"
    assert llm.block_manager.num_free_blocks == 11


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_contiguous_cache_equals_naive(reference, name):
    path, expected = reference(name)
    model = build_model(path)
    assert [list(generate_cached(model, p, GREEDY.max_tokens)) for p in make_prompts()] == expected


def test_static_batching_equals_naive(reference):
    path, expected = reference("qwen3-gqa-tied")
    llm = LLM(path, num_kvcache_blocks=64, kvcache_block_size=4)
    prompts = make_prompts()
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (24, 3, 24, 10, 24, 1, 24, 24, 7, 24)]
    before = llm.generate(prompts, GREEDY, use_tqdm=False)  # fills the prefix cache
    seqs = generate_static(llm, prompts, params, batch_size=4)
    assert [s.completion_token_ids for s in seqs] == [e[: p.max_tokens] for e, p in zip(expected, params)]
    assert all(s.arrival_time <= s.first_token_time <= s.finish_time for s in seqs)
    assert llm.block_manager.num_free_blocks == 64
    after = llm.generate(prompts, GREEDY, use_tqdm=False)  # the static run must not corrupt cached prefixes
    assert [o.token_ids for o in after] == [o.token_ids for o in before] == expected


@pytest.fixture(scope="module")
def story_reference():
    """The default model, held-out openings (two sharing a long prefix) and their naive greedy continuations."""
    from minillm import default_model_path
    from minillm.data import heldout_openings
    from minillm.tokenizer import Tokenizer

    path = default_model_path()
    tok, model = Tokenizer(path), build_model(path)
    openings = heldout_openings(6)
    prompts = [tok.encode(o) for o in openings + [openings[0] + " Then"]]
    eos = [tok.eos_token_id]
    return prompts, [list(generate_naive(model, p, 40, eos_token_ids=eos)) for p in prompts]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_default_model_batched_equals_naive(story_reference, setting, counters):
    prompts, expected = story_reference
    kwargs = dict(SETTINGS[setting])
    if "num_kvcache_blocks" in kwargs:  # preemption: fewer blocks of the story model's longer texts
        kwargs.update(num_kvcache_blocks=40, kvcache_block_size=4)
    llm = LLM(**kwargs)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)
    assert_exercised(setting, counters, llm)


@pytest.mark.parametrize("mixed", [True, False])
def test_stall_probe_running_requests_get_a_token_every_step_only_with_mixed_steps(mixed):
    """Chapter 06's probe on the default model: 8 requests decode when a 300-token prompt arrives (budget 64)."""
    llm = LLM(max_num_batched_tokens=64, mixed_steps=mixed, num_kvcache_blocks=128)
    probe = stall_probe(llm, num_running=8, prompt_len=300, running_len=8, max_tokens=64)
    result = summarize(probe)
    assert result["steps_without_token"] == (0 if mixed else 5)  # 300 tokens in chunks of 64: 5 steps
    assert result["steps_until_first_token"] == (6 if mixed else 5)  # chunks of 56 beside the 8 decode tokens
    assert llm.block_manager.num_free_blocks == 128  # the probe aborts its requests at the end
