"""Safe steps: a failed or interrupted step, a closed stream, a preemption or a borrowed model leaves the engine
exactly as usable as a fresh one, with every block free; checkpoints without a tokenizer, and EOS ids from
generation_config.json."""

import json
import shutil

import pytest
import torch
from checkpoints import make_checkpoint
from scheduling import run_step

from minillm import LLM, SamplingParams
from minillm.config import Config
from minillm.engine.block_manager import BlockManager
from minillm.engine.exceptions import EngineError
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.naive import generate_cached

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPT = list(range(1, 30))  # 7 full blocks of 4 and a partial one
ENGINE = dict(kvcache_block_size=4, num_kvcache_blocks=64)


@pytest.fixture(scope="module")
def fresh_tokens(tiny_checkpoint):
    return LLM(tiny_checkpoint, **ENGINE).generate([PROMPT], GREEDY, use_tqdm=False)[0].token_ids


def all_free(llm) -> bool:
    return llm.is_finished() and llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("fail_at", [1, 4], ids=["prefill", "decode"])
def test_a_step_that_raises_leaves_no_trace(tiny_checkpoint, fresh_tokens, error, fail_at):
    llm = LLM(tiny_checkpoint, **ENGINE)
    model, calls = llm.model_runner.model, []
    forward = model.forward

    def failing_forward(*args):
        calls.append(1)
        if len(calls) == fail_at:
            raise error("injected fault")
        return forward(*args)

    model.forward = failing_forward
    with pytest.raises(error):
        llm.generate([PROMPT], GREEDY, use_tqdm=False)
    del model.forward
    assert all_free(llm), "the failed call's request must be gone, its blocks free"
    out = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.token_ids == fresh_tokens, "the prefix cache must not hand out blocks the failed step never filled"
    assert out.num_cached_tokens == (0 if fail_at == 1 else 28)


def test_a_request_whose_steps_fail_fails_alone_and_the_others_go_on(tiny_checkpoint, fresh_tokens):
    """One request makes every step it is in fail (its sampling raises). The first such step holds two requests:
    it is rolled back and each is run alone; the other then gets its tokens, the culprit fails by itself."""
    llm = LLM(tiny_checkpoint, **ENGINE)
    good, bad = llm.add_request(PROMPT, GREEDY), llm.add_request([5, 6, 7], GREEDY)
    prepare_sample = llm.model_runner.prepare_sample

    def failing(seqs, *args, **kwargs):
        if bad in seqs:
            raise RuntimeError("injected: this request's sampling fails")
        return prepare_sample(seqs, *args, **kwargs)

    llm.model_runner.prepare_sample = failing
    failures = []
    while not llm.is_finished():
        try:
            llm.step()
        except EngineError as e:
            failures.append(str(e))
    assert failures == [f"request {bad.request_id} failed: RuntimeError: injected: this request's sampling fails"]
    assert bad.finish_reason == "error" and not bad.block_table
    assert good.completion_token_ids == fresh_tokens and all_free(llm)
    assert not llm.engine_core.requests and not llm.engine_core.suspects


@pytest.mark.parametrize("how", ["break", "close", "exception"])
def test_a_stream_closed_early_leaves_nothing_running(tiny_checkpoint, fresh_tokens, how):
    llm = LLM(tiny_checkpoint, **ENGINE)
    stream = llm.stream([PROMPT, [5, 6, 7]], SamplingParams(temperature=0, max_tokens=30))
    if how == "break":
        for _ in stream:
            break
        del stream
    elif how == "close":
        next(stream)
        stream.close()
    else:
        with pytest.raises(ZeroDivisionError):
            for _ in stream:
                1 / 0
        del stream
    assert all_free(llm)
    outputs = llm.generate([PROMPT], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [fresh_tokens]


def test_abort_request_frees_its_blocks(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, **ENGINE)
    kept, dropped = llm.add_request([1, 2, 3], GREEDY), llm.add_request(PROMPT, GREEDY)
    llm.step()
    assert dropped.block_table
    llm.abort_request(dropped)
    assert dropped.finish_reason == "abort" and not dropped.block_table
    while not llm.is_finished():
        llm.step()
    assert kept.finish_reason == "length" and all_free(llm)


def test_a_high_priority_request_is_never_the_victim_while_a_lower_one_runs():
    # 5 blocks of 2: low, admitted first, decodes ahead of high in the running queue; when both need a block
    # and one is left, low takes it first, and then high must preempt low, not itself.
    s = Scheduler(Config(scheduling_policy="priority", new_token_ratio=0.0), BlockManager(5, 2), eos_token_ids=[0])
    low = Sequence([1, 2], priority=0)
    s.add(low)
    run_step(s)
    high = Sequence([3, 4], priority=5)
    s.add(high)
    for _ in range(4):  # high's prefill, then three decode steps: the third needs two blocks, one is free
        run_step(s)
        assert high.status == SequenceStatus.RUNNING
    assert low.status == SequenceStatus.WAITING and not low.block_table


def test_a_waiting_request_of_higher_priority_preempts_a_running_lower_one():
    s = Scheduler(
        Config(scheduling_policy="priority", max_num_seqs=1, new_token_ratio=0.0), BlockManager(8, 2), eos_token_ids=[0]
    )
    low = Sequence([1, 2, 3], priority=0)
    s.add(low)
    run_step(s)
    high = Sequence([4, 5], priority=5)
    s.add(high)
    output = s.schedule()
    assert (
        output.is_prefill
        and output.scheduled == [high]
        and low.status == SequenceStatus.WAITING
        and not low.block_table
    )


def test_cached_tokens_count_the_prompt_at_first_admission(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, kvcache_block_size=4, num_kvcache_blocks=24)
    preempted = []
    preempt = llm.scheduler.preempt
    llm.scheduler.preempt = lambda seq: preempted.append(seq) or preempt(seq)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (17, 40, 33, 16)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    assert preempted, "the tiny cache must force preemption"
    assert all(o.num_cached_tokens <= len(o.prompt_token_ids) for o in outputs)
    assert all(o.num_cached_tokens == 0 for o in outputs), "nothing was cached when these prompts first arrived"


def test_the_naive_generators_do_not_disturb_an_engines_model(tiny_checkpoint, fresh_tokens):
    llm = LLM(tiny_checkpoint, **ENGINE)
    assert list(generate_cached(llm.model_runner.model, PROMPT, 12)) == fresh_tokens
    assert llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].token_ids == fresh_tokens


def test_a_checkpoint_without_a_tokenizer(tiny_checkpoint, tmp_path, fresh_tokens):
    for f in tiny_checkpoint.iterdir():
        if f.name != "tokenizer.json":
            shutil.copy(f, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer\.json.*skip_tokenizer_init=True"):
        LLM(tmp_path)
    llm = LLM(tmp_path, skip_tokenizer_init=True, **ENGINE)
    out = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.token_ids == fresh_tokens and out.text == ""
    assert [p.text for p in llm.stream([PROMPT], GREEDY)] == [""] * 12
    with pytest.raises(ValueError, match="give prompts as token id lists"):
        llm.generate(["Once upon a time"], GREEDY, use_tqdm=False)


def test_eos_ids_of_generation_config_stop_a_request(tmp_path, fresh_tokens):
    make_checkpoint("qwen3-gqa-tied", tmp_path)
    eos = fresh_tokens[4]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    out = LLM(tmp_path, **ENGINE).generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.token_ids == fresh_tokens[: fresh_tokens.index(eos) + 1]
