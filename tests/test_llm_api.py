"""The LLM API: clear errors before any work, reproducible seeds, priorities, streaming."""

import math

import pytest
from checkpoints import make_checkpoint

from minillm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    make_checkpoint("qwen3-gqa-tied", path)
    return LLM(path, num_kvcache_blocks=40, kvcache_block_size=4)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(temperature=-1.0), "temperature must be a finite number >= 0"),
        (dict(temperature=math.nan), "temperature must be a finite number >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=math.nan), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-2), "top_k must be an integer >= -1"),
        (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
        (dict(stop_token_ids=[-1]), "stop_token_ids must be token ids"),
    ],
)
def test_bad_sampling_parameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "prompt,params,message",
    [
        ("", SamplingParams(), "the prompt is empty"),
        ([], SamplingParams(), "the prompt is empty"),
        ([1, 2, 999], SamplingParams(), r"unknown token ids \[999\]: ids must be integers in \[0, 256\)"),
        ([1] * 250, SamplingParams(max_tokens=10), r"= 260 exceeds max_model_len=256: shorten the prompt or lower"),
        (
            [1] * 150,
            SamplingParams(max_tokens=20),
            r"KV cache \(40 blocks of 4 tokens\) cannot hold one request of 170",
        ),
    ],
)
def test_bad_requests_are_rejected_before_any_work(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["ok" if isinstance(prompt, str) else [5, 6], prompt], params, use_tqdm=False)
    assert llm.is_finished(), "a rejected call must leave nothing queued"


def test_top_k_minus_one_means_no_limit_as_in_vllm():
    assert SamplingParams(top_k=-1) == SamplingParams(top_k=0)


def test_an_empty_string_is_empty_even_where_it_encodes_to_a_bos():
    llm = LLM(num_kvcache_blocks=8)
    assert llm.tokenizer.encode("") != []  # the default model's tokenizer adds BOS
    with pytest.raises(ValueError, match="the prompt is empty"):
        llm.generate("", use_tqdm=False)


def test_prompts_of_strings_and_ids_mixed_are_named(llm):
    with pytest.raises(ValueError, match="the prompts mix strings and token id lists"):
        llm.generate(["ok", [1, 2]], use_tqdm=False)
    assert llm.is_finished()


@pytest.mark.parametrize("size", [0, 3, 24])
def test_a_block_size_must_be_a_positive_power_of_two(size):
    with pytest.raises(ValueError, match="kvcache_block_size must be a p"):
        LLM(kvcache_block_size=size, num_kvcache_blocks=8)


def test_one_sampling_params_per_prompt_or_one_for_all(llm):
    with pytest.raises(ValueError, match="2 prompts but 3 sampling params"):
        llm.generate(["a", "b"], [SamplingParams()] * 3, use_tqdm=False)


def test_unknown_engine_option_is_named(tmp_path):
    with pytest.raises(TypeError, match=r"unknown engine option\(s\) \['max_num_seq'\]"):
        LLM(tmp_path, max_num_seq=4)


def test_seeded_sampling_does_not_depend_on_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=1234)
    alone = llm.generate([[5, 6, 7]], seeded, use_tqdm=False)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=n) for n in (5, 30, 12)]
    crowd = llm.generate(
        [[9, 9], [5, 6, 7], [1, 2, 3, 4, 5, 6], [40] * 9], [others[0], seeded, *others[1:]], use_tqdm=False
    )
    assert crowd[1].token_ids == alone
    assert (
        llm.generate([[5, 6, 7]], SamplingParams(temperature=1.0, max_tokens=20, seed=99), use_tqdm=False)[0].token_ids
        != alone
    )


def test_finish_reasons_and_stop_tokens(llm):
    greedy = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 12
    stop = greedy.token_ids[5]
    out = llm.generate(
        [[3, 4, 5]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]), use_tqdm=False
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == greedy.token_ids[: greedy.token_ids.index(stop) + 1]
    assert out.arrival_time <= out.first_token_time <= out.finish_time


def test_priority_policy_serves_higher_priority_first(tmp_path):
    make_checkpoint("qwen3-gqa-tied", tmp_path)
    llm = LLM(tmp_path, scheduling_policy="priority", max_num_seqs=1)
    outs = llm.generate(
        [[1, 2], [3, 4], [5, 6]], SamplingParams(temperature=0, max_tokens=4), priorities=[0, 5, 1], use_tqdm=False
    )
    order = sorted(range(3), key=lambda i: outs[i].finish_time)
    assert order == [1, 2, 0]


def test_stream_yields_the_same_text_as_generate(llm):
    prompts = [[10, 11, 12], [20, 21]]
    params = SamplingParams(temperature=0, max_tokens=15)
    texts, finished = ["", ""], [0, 0]
    for piece in llm.stream(prompts, params):
        texts[piece.index] += piece.text
        finished[piece.index] += piece.finished
    assert texts == [o.text for o in llm.generate(prompts, params, use_tqdm=False)]
    assert finished == [1, 1]


def test_outputs_report_prefix_cache_hits(llm):
    shared = list(range(30, 62))  # 8 full blocks of 4
    first, second = (
        llm.generate([shared + [1]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False),
        llm.generate([shared + [2]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False),
    )
    assert first[0].num_cached_tokens == 0 and second[0].num_cached_tokens == 32
