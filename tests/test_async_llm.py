"""AsyncLLM: requests from asyncio tasks get the tokens LLM.generate gives them; a consumer that leaves aborts its
request and frees its blocks; a request whose step fails alone fails, the engine serves on; stop strings cut the text; a full queue
refuses at once; close() leaves no thread."""

import asyncio
import threading

import pytest

from minillm import LLM, SamplingParams
from minillm.engine.async_llm import AsyncLLM, EngineError, QueueFullError
from minillm.engine.output_processor import DeltaOutput, OutputCollector

GREEDY = SamplingParams(temperature=0, max_tokens=24)
LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
PROMPTS = ["Once upon a time", "The little fox", "Mia had a red ball"]


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kvcache_blocks=32)


@pytest.fixture(scope="module")
def reference(llm):
    return {p: out for p, out in zip(PROMPTS, llm.generate(PROMPTS, GREEDY, use_tqdm=False))}


async def run(stream) -> tuple[str, list[int], str]:
    text, token_ids, finish_reason = "", [], None
    async for out in stream:
        text, token_ids, finish_reason = text + out.text, token_ids + out.token_ids, out.finish_reason
    return text, token_ids, finish_reason


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "minillm-engine"]


async def free_blocks(async_llm: AsyncLLM) -> tuple[int, int, bool]:
    return await async_llm.run_in_engine(
        lambda core: (core.block_manager.num_free_blocks, len(core.block_manager.blocks), not core.requests)
    )


def test_requests_arriving_at_any_time_get_llm_generates_tokens(llm, reference):
    async def main():
        async with AsyncLLM(llm) as async_llm:
            first = await async_llm.add_request(PROMPTS[0], GREEDY)
            head = await anext(first)  # the first request is decoding when the others arrive
            late = [asyncio.ensure_future(run(async_llm.generate(p, GREEDY))) for p in PROMPTS[1:]]
            rest = await run(first)
            results = [rest, *await asyncio.gather(*late)]
            assert await free_blocks(async_llm) == (32, 32, True)
        return results, len(head.token_ids)

    results, taken = asyncio.run(main())
    ref = reference[PROMPTS[0]]
    assert results[0][1] == ref.token_ids[taken:]  # all but the tokens taken by anext (one, or more on a busy host)
    for prompt, (text, token_ids, finish_reason) in zip(PROMPTS[1:], results[1:]):
        ref = reference[prompt]
        assert (text, token_ids, finish_reason) == (ref.text, ref.token_ids, ref.finish_reason)
    assert not engine_threads()


@pytest.mark.parametrize("how", ["cancel", "aclose"])
def test_a_consumer_that_leaves_aborts_its_request_and_frees_its_blocks(llm, how):
    async def main():
        async with AsyncLLM(llm) as async_llm:
            stream = await async_llm.add_request(PROMPTS[0], LONG)
            started = asyncio.Event()

            async def consume():
                async for _ in stream:
                    started.set()

            task = asyncio.ensure_future(consume())
            await started.wait()
            free, total, _ = await free_blocks(async_llm)
            assert free < total  # the request holds blocks
            if how == "cancel":
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                await stream.aclose()
                await task  # the consumer stops too
            assert await free_blocks(async_llm) == (total, total, True)  # the abort came first in the queue
            assert async_llm.num_waiting == 0
            return await run(async_llm.generate(PROMPTS[1], GREEDY))  # and the engine serves on

    assert asyncio.run(main())[2] in ("stop", "length")


def straddling_stop(tokenizer, token_ids: list[int], text: str) -> str:
    """Three characters of text that begin in one token and end in the next, first seen there: a stop string that
    only text held back (not sent before the next token shows whether it begins a stop string) keeps out."""
    for i in range(len(token_ids) // 2, len(token_ids)):
        end = len(tokenizer.decode(token_ids[:i]))  # where token i begins
        stop = text[end - 1 : end + 2]
        if len(stop) == 3 and text.index(stop) == end - 1:
            return stop
    raise AssertionError(f"no stop string straddles two tokens in {text!r}")


def test_stop_strings_cut_the_text_even_across_tokens(llm, reference):
    ref = reference[PROMPTS[0]]
    stop = straddling_stop(llm.tokenizer, ref.token_ids, ref.text)
    expected = ref.text[: ref.text.index(stop)]

    async def main():
        async with AsyncLLM(llm) as async_llm:
            stopped = await run(async_llm.generate(PROMPTS[0], GREEDY, stop=["\x00never", stop]))
            unmatched = await run(async_llm.generate(PROMPTS[0], GREEDY, stop=["\x00never"]))
            return stopped, unmatched, await free_blocks(async_llm)

    (text, token_ids, finish_reason), unmatched, blocks = asyncio.run(main())
    # held back until it could no longer begin the stop string: no piece of the stop string was sent
    assert (text, finish_reason) == (expected, "stop")
    assert len(token_ids) < len(ref.token_ids) and token_ids == ref.token_ids[: len(token_ids)]
    assert unmatched[0] == ref.text  # the held-back text is sent at the end
    assert blocks == (32, 32, True)  # the request cut by a stop string was aborted


def test_a_failed_step_fails_its_requests_and_the_engine_serves_on(llm, reference, monkeypatch):
    run_model, calls = llm.model_runner.run, []

    def fail_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        return run_model(*args)

    monkeypatch.setattr(llm.model_runner, "run", fail_once)

    async def main():
        async with AsyncLLM(llm) as async_llm:
            with pytest.raises(EngineError, match="RuntimeError: injected fault"):  # its step, alone, failed
                await run(async_llm.generate(PROMPTS[0], GREEDY))
            assert await free_blocks(async_llm) == (32, 32, True)
            return await run(async_llm.generate(PROMPTS[1], GREEDY))

    ref = reference[PROMPTS[1]]
    assert asyncio.run(main()) == (ref.text, ref.token_ids, ref.finish_reason)


def test_a_full_queue_refuses_at_once_and_bad_requests_get_the_engines_message(llm, monkeypatch):
    release, step = threading.Event(), llm.engine_core.step
    monkeypatch.setattr(llm.engine_core, "step", lambda: release.wait(30) and step())  # held in its first step

    async def main():
        async with AsyncLLM(llm, max_queue=1) as async_llm:
            with pytest.raises(ValueError, match="the prompt is empty"):
                await async_llm.add_request("", GREEDY)
            held = await async_llm.add_request(PROMPTS[0], GREEDY)  # waits for its first token
            with pytest.raises(QueueFullError, match=r"1 requests are waiting .*max_queue=1"):
                await async_llm.add_request(PROMPTS[1], GREEDY)
            release.set()
            await run(held)
            await run(async_llm.generate(PROMPTS[1], GREEDY))  # room again

    asyncio.run(main())


def test_close_fails_unfinished_requests_and_leaves_no_thread(llm):
    async def main():
        async_llm = AsyncLLM(llm)
        stream = await async_llm.add_request(PROMPTS[0], LONG)
        await anext(stream)
        assert len(engine_threads()) == 1
        async_llm.close()
        with pytest.raises(EngineError, match="closed"):
            await run(stream)
        with pytest.raises(EngineError, match="closed"):
            await async_llm.add_request(PROMPTS[0], GREEDY)
        assert not async_llm.is_alive()

    asyncio.run(main())
    assert not engine_threads()
    assert llm.is_finished() and llm.block_manager.num_free_blocks == 32


class Recorder:
    def __init__(self):
        self.scheduler, self.iterations = [], []

    def record(self, scheduler_stats, iteration_stats, engine_idx=0):
        self.scheduler.append(scheduler_stats)
        self.iterations.append(iteration_stats)

    def total(self, name):
        return sum(getattr(it, name) for it in self.iterations)

    def all(self, name):
        return [x for it in self.iterations for x in getattr(it, name)]


def test_stats_count_tokens_latencies_and_preemptions(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, kvcache_block_size=4, num_kvcache_blocks=24)  # too small: it must preempt
    prompts = [list(range(n, n + 20)) for n in (1, 40, 80, 120)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [out.token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    before = llm.scheduler.num_preemptions
    recorder = Recorder()

    async def main():
        async with AsyncLLM(llm, stat_loggers=[recorder]) as async_llm:
            return await asyncio.gather(*(run(async_llm.generate(p, params)) for p in prompts))

    assert [token_ids for _, token_ids, _ in asyncio.run(main())] == expected  # preemption changes no token
    preempted = sum(s.num_preempted_reqs for s in recorder.scheduler)
    assert preempted == llm.scheduler.num_preemptions - before > 0
    assert recorder.total("num_generation_tokens") == 4 * 24
    assert recorder.total("num_prompt_tokens") == recorder.total("prefix_cache_queries") == 4 * 20
    assert len(recorder.all("time_to_first_tokens_iter")) == len(recorder.all("e2e_latencies")) == 4
    assert len(recorder.all("inter_token_latencies_iter")) == 4 * 23
    last = recorder.scheduler[-1]
    assert (last.num_running_reqs, last.num_waiting_reqs, last.kv_cache_usage) == (0, 0, 0)
    assert max(s.kv_cache_usage for s in recorder.scheduler) > 0.5


def test_a_slow_reader_gets_what_it_missed_merged_into_one_output():
    """What a reader has not taken yet is one merged output, not an object per step: its memory is the text."""

    async def main():
        collector = OutputCollector()
        for i in range(1000):
            collector.put(DeltaOutput(f"{i} ", [i]))
        collector.put(DeltaOutput("end", [1000], "length"))
        merged = await collector.get()
        collector.put(EngineError("late"))
        collector.put(DeltaOutput("ignored", [0]))  # an error is final
        return merged, await collector.get()

    merged, error = asyncio.run(main())
    assert merged.token_ids == list(range(1001)) and merged.text.startswith("0 1 2 ") and merged.text.endswith("end")
    assert merged.finish_reason == "length" and isinstance(error, EngineError)
