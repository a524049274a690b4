"""What AsyncLLM makes of each step for each request: the new text (incrementally detokenized, cut at a stop
string), the stream a caller reads it from, and the statistics its metrics are made of (vLLM's OutputProcessor,
IterationStats, SchedulerStats)."""

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams
from minillm.tokenizer import IncrementalDetokenizer

if TYPE_CHECKING:  # the stream calls back into the AsyncLLM that made it
    from minillm.engine.async_llm import AsyncLLM


@dataclass
class DeltaOutput:
    """What one step added to a request: its new text and token ids; on the last one, why it finished."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS, a stop token or a stop string) or "length", on the last output

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class IterationStats:
    """What one engine step did for the requests AsyncLLM serves (vLLM's IterationStats): tokens, preemptions,
    prefix-cache lookups of the prompts that got their first token, and latencies in seconds."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preempted_reqs: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, the tokens found there
    spec_decode: tuple[int, int, int] = (0, 0, 0)  # speculative decoding: drafts, draft tokens, accepted tokens
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    e2e_latencies: list[float] = field(default_factory=list)  # of the requests that finished


@dataclass(frozen=True)
class SchedulerStats:
    """The engine's queues and KV cache after a step (vLLM's SchedulerStats); kv_cache_usage is in [0, 1]."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float

    @classmethod
    def of(cls, engine) -> "SchedulerStats":
        bm = engine.block_manager
        return cls(
            len(engine.scheduler.running), len(engine.scheduler.waiting), 1 - bm.num_free_blocks / len(bm.blocks)
        )


def find_stop_string(text: str, stop: tuple[str, ...], start: int) -> int:
    """Where the earliest of the stop strings begins in text at or after start, or -1."""
    return min((i for s in stop if (i := text.find(s, start)) != -1), default=-1)


class RequestState:
    """One request of AsyncLLM: where its outputs go (a queue on the caller's event loop), its sequence and
    detokenizer (touched on the engine thread only), and its timestamps.

    With stop strings, the text is held back by one character less than the longest of them until it cannot be
    the start of one, so that a stop string split across tokens never reaches the client; once one appears, the
    text is cut before it and the request finishes with "stop" (vLLM's convention: the stop string is left out)."""

    def __init__(self, prompt: str | list[int], sampling_params: SamplingParams, stop: tuple[str, ...]):
        self.prompt, self.sampling_params, self.stop = prompt, sampling_params, stop
        self.hold = max(map(len, stop), default=1) - 1
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.seq: Sequence | None = None
        self.detokenizer: IncrementalDetokenizer | None = None
        self.num_sent_chars = 0
        self.num_tokens = 0  # completion tokens turned into outputs so far
        self.waiting = True  # counted in AsyncLLM's queue until its first token (or its end)
        self.arrival_time = time.perf_counter()
        self.last_token_time: float | None = None

    def process(self, seq: Sequence, now: float, stats: IterationStats) -> DeltaOutput:
        """The output for the tokens seq got in the step that ended at `now` (one, or several when the step kept
        drafts, chapter 13); adds to stats."""
        if self.last_token_time is None:
            stats.time_to_first_tokens_iter.append(now - self.arrival_time)
            stats.num_prompt_tokens += seq.num_prompt_tokens
            stats.prefix_cache_queries += seq.num_prompt_tokens
            stats.prefix_cache_hits += seq.num_prompt_cached_tokens or 0
        else:
            stats.inter_token_latencies_iter.append(now - self.last_token_time)
        self.last_token_time = now
        new = seq.completion_token_ids[self.num_tokens :]
        self.num_tokens += len(new)
        stats.num_generation_tokens += len(new)
        finish_reason, text = seq.finish_reason, ""
        if self.detokenizer is not None:
            searched = len(self.detokenizer.text) - self.hold  # a stop string may begin this far back
            for token in new:
                self.detokenizer.add(token)
            text = self.detokenizer.text
            if self.stop and (cut := find_stop_string(text, self.stop, max(searched, 0))) != -1:
                text, finish_reason = text[:cut], "stop"
            end = len(text) if finish_reason else max(self.num_sent_chars, len(text) - self.hold)
            text, self.num_sent_chars = text[self.num_sent_chars : end], end
        if finish_reason:
            stats.e2e_latencies.append(now - self.arrival_time)
        return DeltaOutput(text, new, finish_reason)


class QueueFullError(RuntimeError):
    """max_queue requests are already waiting for their first token (a server answers 429: retry later)."""


class EngineError(RuntimeError):
    """The engine could not serve this request: its step failed (the engine rolled the step back and serves the
    other requests), or AsyncLLM was closed. A server answers 500."""


class RequestStream:
    """The outputs of one request, as an async iterator of DeltaOutput. Leaving it early (aclose(), abort(), a
    cancelled consumer task, or dropping it) aborts the request and frees its KV blocks."""

    def __init__(self, async_llm: "AsyncLLM", request: RequestState):
        self._async_llm, self._request = async_llm, request
        self.prompt_token_ids: list[int] = []  # set once the engine has accepted the request
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> DeltaOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._request.queue.get()
        except BaseException:  # cancelled while waiting
            self.abort()
            raise
        if item is None or self.finished:  # aborted (by another task) while this consumer waited
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def abort(self) -> None:
        """Stop the request if it is unfinished: it yields nothing more (a consumer waiting for it stops too). To
        be called on the request's event loop."""
        if not self.finished:
            self._abort()
            self._request.queue.put_nowait(None)

    def _abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._async_llm._submit(self._async_llm._finish, self._request, wait=False)

    async def aclose(self) -> None:
        self.abort()

    def __del__(self):  # dropped unfinished, by whatever thread collects it: nobody waits for it
        self._abort()
