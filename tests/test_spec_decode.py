"""Speculative decoding (chapter 13) beyond the exercises: the settings' errors, the draft-model proposer, and the
proof that sampling is unchanged: many seeded draws from a small-vocabulary model with speculation on follow the
model's exact distribution (chi-square), and a deliberately wrong residual rule is caught by the same test."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from minillm import LLM, SamplingParams, default_model_path
from minillm.config import draft_model_path
from minillm.course.stats import chi_square_pvalue
from minillm.layers import rejection_sampler
from minillm.layers.sampler import SamplingMetadata, probabilities
from minillm.models import build_model
from minillm.naive import generate_naive

GREEDY = SamplingParams(temperature=0, max_tokens=40)


@pytest.mark.parametrize(
    "spec,error",
    [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method must be one of ngram, draft_model"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "<="),
        ({"method": "draft_model", "num_speculative_tokens": 2}, 'needs "model"'),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "keys among"),
        (
            {"method": "draft_model", "model": "m", "num_speculative_tokens": 2, "quantization": "fp4"},
            "speculative_config quantization must be None or one of int8, gguf, got 'fp4'",
        ),
        (
            {"method": "draft_model", "model": "m", "num_speculative_tokens": 2, "kv_cache_dtype": "fp8"},
            "speculative_config kv_cache_dtype must be one of auto, int8, got 'fp8'",
        ),
    ],
)
def test_bad_speculative_configs_are_refused_naming_the_field(spec, error):
    with pytest.raises(ValueError, match=error):
        LLM(speculative_config=spec)


def test_a_draft_with_another_vocabulary_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        LLM(speculative_config={"method": "draft_model", "model": str(tiny_checkpoint), "num_speculative_tokens": 2})


@pytest.fixture(scope="module")
def stories():
    from minillm.data import heldout_openings
    from minillm.tokenizer import Tokenizer

    tok, model = Tokenizer(default_model_path()), build_model(default_model_path())
    prompts = [tok.encode(o) for o in heldout_openings(5)]
    prompts.append(prompts[0] + prompts[0][1:])  # a prefix the cache holds
    eos = [tok.eos_token_id]
    return prompts, [list(generate_naive(model, p, GREEDY.max_tokens, eos_token_ids=eos)) for p in prompts]


@pytest.mark.parametrize("draft", ["itself", "shipped draft"])
@pytest.mark.parametrize("blocks", [None, 40])  # 40 blocks of 4: the target preempts
def test_draft_model_speculation_gives_the_plain_greedy_tokens(stories, draft, blocks):
    prompts, expected = stories
    model = default_model_path() if draft == "itself" else draft_model_path()
    kwargs = dict(num_kvcache_blocks=blocks, kvcache_block_size=4) if blocks else {}
    spec = {"method": "draft_model", "model": str(model), "num_speculative_tokens": 4}
    llm = LLM(speculative_config=spec, **kwargs)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected
    stats = llm.spec_stats
    if draft == "itself":  # the target guessing itself is always right
        assert stats.acceptance_rate == 1.0 and stats.mean_acceptance_length > 4
    else:
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert sum(o.num_draft_tokens for o in outputs) == stats.num_draft_tokens
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)
    draft = llm.drafter.runner  # no cache of its own to leak: the target's blocks, in its own tensors
    assert draft.num_kvcache_blocks == llm.model_runner.num_kvcache_blocks
    assert draft.kv_cache.shape[2] == llm.model_runner.kv_cache.shape[2]


@pytest.mark.parametrize("draft_kv", ["auto", "int8"])
def test_a_gguf_target_with_a_float_draft_of_its_own_kv_dtype_gives_its_greedy_tokens(stories, tmp_path, draft_kv):
    """The draft keeps its own settings (float safetensors weights, its own cache dtype) whatever the target's are
    (a GGUF file with an int8 cache): it once inherited the target's quantization and failed to load."""
    from minillm.bench.gguf_export import export

    target = export(default_model_path(), tmp_path, "q8_0")
    prompts = stories[0][:3]
    plain = LLM(target, kv_cache_dtype="int8", skip_tokenizer_init=True).generate(prompts, GREEDY, use_tqdm=False)
    spec = {"method": "draft_model", "model": str(draft_model_path()), "num_speculative_tokens": 3}
    llm = LLM(
        target, kv_cache_dtype="int8", skip_tokenizer_init=True, speculative_config=spec | {"kv_cache_dtype": draft_kv}
    )
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    draft = llm.drafter.runner
    assert type(draft.platform.linear_method).__name__ != "GGUFLinearMethod" and draft.kv_cache_dtype == draft_kv
    assert llm.spec_stats.num_accepted_tokens > 0


def random_vocab8(path, seed: int, layers: int):
    """A random Qwen3 over 8 tokens: every token has a fair chance, so a sample of a few thousand tells
    distributions apart."""
    config = Qwen3Config(
        vocab_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        initializer_range=0.3,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    return random_vocab8(tmp_path_factory.mktemp("vocab8"), seed=0, layers=2)


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory):
    """Another random model over the same 8 tokens: a draft whose guesses are often wrong, drawn from its own q."""
    return random_vocab8(tmp_path_factory.mktemp("draft8"), seed=1, layers=1)


TEMPERATURE_1 = dict(temperature=1.0)
TRUNCATED = dict(temperature=0.7, top_k=6, top_p=0.9)  # top-k and top-p both cut the distribution


def exact_pairs(path, prompt, sampling=TEMPERATURE_1) -> torch.Tensor:
    """The model's exact probability of each first two tokens (t1, t2) after prompt, under the sampling settings
    (temperature, top-k, top-p), flattened to t1 * 8 + t2."""
    model, md = build_model(path), SamplingMetadata.build([SamplingParams(**sampling)], [None])
    with torch.no_grad():
        logits = lambda ids: model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)))[-1:])
        p = lambda ids: probabilities(logits(ids), md)[0]
        p1 = p(prompt)
        return torch.cat([p1[t] * p(prompt + [t]) for t in range(8)])


def pair_counts(path, prompt, n=4000, sampling=TEMPERATURE_1, draft=None) -> torch.Tensor:
    """(t1, t2) of n seeded requests with speculation: n-gram lookup (every token occurs in the prompt, so lookup
    always proposes the token that followed it there) or a draft model; either way step 2 is a verify step."""
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 1, "prompt_lookup_min": 1}
    if draft is not None:
        spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}
    llm = LLM(path, skip_tokenizer_init=True, speculative_config=spec, max_num_seqs=256, num_kvcache_blocks=2048)
    params = [SamplingParams(max_tokens=3, seed=i, ignore_eos=True, **sampling) for i in range(n)]
    outputs = llm.generate([prompt] * n, params, use_tqdm=False)
    assert llm.spec_stats.num_draft_tokens >= n, "every request verified a draft at its second token"
    return torch.bincount(torch.tensor([o.token_ids[0] * 8 + o.token_ids[1] for o in outputs]), minlength=64)


PROMPT = [3, 0, 1, 2, 3, 4, 5, 6, 7, 5, 2]


@pytest.mark.parametrize("sampling", [TEMPERATURE_1, TRUNCATED], ids=["temperature 1", "0.7 top-k top-p"])
@pytest.mark.parametrize("proposer", ["ngram", "draft model"])
def test_sampling_with_speculation_follows_the_models_distribution(small_vocab, small_draft, proposer, sampling):
    draft = small_draft if proposer == "draft model" else None
    counts = pair_counts(small_vocab, PROMPT, sampling=sampling, draft=draft)
    assert chi_square_pvalue(counts, exact_pairs(small_vocab, PROMPT, sampling)) > 0.01


@pytest.mark.parametrize("proposer", ["ngram", "draft model"])
def test_the_same_test_catches_a_wrong_residual_rule(small_vocab, small_draft, proposer, monkeypatch):
    """Wrong on purpose: on rejection, redraw from the target's whole distribution (the draft token included)
    instead of the residual max(p - q, 0): the draft token comes out too often."""
    right = rejection_sampler.rejection_sample

    def wrong(target_probs, draft_ids, num_drafts, draft_probs, uniform, exponential):
        tokens = right(target_probs, draft_ids, num_drafts, draft_probs, uniform, exponential)
        n = (tokens != rejection_sampler.PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1  # where the target's own token is
        rows = torch.arange(len(n))[n < num_drafts]  # rejected at n: draw again from p, the draft token allowed
        tokens[rows, n[rows]] = (target_probs[rows, n[rows]] / exponential[rows]).argmax(dim=1)
        return tokens

    monkeypatch.setattr(rejection_sampler, "rejection_sample", wrong)
    counts = pair_counts(small_vocab, PROMPT, draft=small_draft if proposer == "draft model" else None)
    assert chi_square_pvalue(counts, exact_pairs(small_vocab, PROMPT)) < 0.01


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("proposer", ["ngram", "shipped draft"])
def test_greedy_speculation_gives_the_plain_engines_tokens_at_batch_1_and_8(stories, proposer, batch, kv_cache_dtype):
    """Prompts of mixed lengths, one at a time or eight together, with a float or int8 KV cache (the draft's cache
    as the target's): the tokens of the same engine without speculation."""
    prompts = stories[0] + [stories[0][1][:3], stories[0][2] * 2]
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if proposer == "shipped draft":
        spec = {"method": "draft_model", "model": str(draft_model_path()), "num_speculative_tokens": 4}
        spec["kv_cache_dtype"] = kv_cache_dtype
    options = dict(max_num_seqs=batch, kv_cache_dtype=kv_cache_dtype)
    plain = LLM(**options).generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(speculative_config=spec, **options)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == [o.token_ids for o in plain]
    assert 0 < llm.spec_stats.num_accepted_tokens < llm.spec_stats.num_draft_tokens
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


def test_the_draft_models_cache_is_inside_the_kv_budget():
    """The target sizes its cache after loading the draft: the same budget holds both caches, block for block."""
    budget = 8 * 2**20
    plain = LLM(kvcache_memory_bytes=budget).model_runner
    spec = {"method": "draft_model", "model": str(draft_model_path()), "num_speculative_tokens": 4}
    runner = LLM(kvcache_memory_bytes=budget, speculative_config=spec).model_runner
    draft = runner.drafter.runner
    both = runner.kv_cache_bytes_per_block + draft.kv_cache_bytes_per_block
    assert runner.num_kvcache_blocks == draft.num_kvcache_blocks == budget // both < plain.num_kvcache_blocks
    assert runner.kv_cache.nbytes + draft.kv_cache.nbytes <= budget + both  # + the spare block each keeps


def test_streaming_yields_every_token_of_a_step_and_closing_early_frees_every_block(stories):
    prompts, expected = stories
    spec = {"method": "draft_model", "model": str(default_model_path()), "num_speculative_tokens": 3}
    llm = LLM(speculative_config=spec)
    tokens, finished = {}, []
    for out in llm.stream(prompts[:3], GREEDY):
        tokens.setdefault(out.index, []).append(out.token_id)
        finished += [out.index] if out.finished else []
    assert [tokens[i] for i in range(3)] == expected[:3] and sorted(finished) == [0, 1, 2]
    stream = llm.stream(prompts[:2], GREEDY)
    next(stream), next(stream)
    stream.close()  # aborts both requests mid-way
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


def test_drafts_after_a_kept_eos_draft_count_as_drafted_not_accepted():
    """The sampler kept all 3 drafts and added its own token, but the second draft was an EOS: the request got 2
    tokens, so 2 drafts count as accepted, not 3 (and 3 as drafted); a step cut at the target's own token loses no
    accepted draft, and a sequence that verified nothing counts nothing."""
    from types import SimpleNamespace

    from minillm.spec_decode.metrics import SpecDecodingStats

    seqs = [SimpleNamespace(num_draft_tokens=0, num_accepted_tokens=0) for _ in range(3)]
    stats = SpecDecodingStats()
    stats.observe(seqs, [3, 2, 0], [[5, 0, 7, 8], [4, 6, 9], [1]], [2, 3, 1])
    assert stats.counts() == (2, 5, 4)
    assert [(s.num_draft_tokens, s.num_accepted_tokens) for s in seqs] == [(3, 2), (2, 2), (0, 0)]


@pytest.mark.parametrize("batch, k", [(1, 4), (1, 2), (4, 4), (16, 3)])
def test_every_verify_step_has_a_compiled_bucket(batch, k):
    """A verify step is a decode step of up to batch × (k + 1) rows: the decode buckets reach that far (at batch 1
    and k = 4, five rows replay in the bucket of 8), so compiled speculation never falls back to eager steps."""
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3}
    graphs = LLM(max_num_seqs=batch, enforce_eager=False, speculative_config=spec).model_runner.graphs
    assert all(graphs.bucket_for(rows) is not None for rows in range(1, batch * (k + 1) + 1))
