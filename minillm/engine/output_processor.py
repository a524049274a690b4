"""OutputProcessor's side of a request (vLLM's vllm/v1/engine/output_processor.py): what the front end makes of the
engine core's new token ids for each request: its new text (detokenized incrementally, cut at a stop string), handed
to the caller through a collector that merges what a slow reader has not taken yet, and the statistics its metrics
are made of."""

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from minillm.engine.messages import EngineCoreOutput, EngineCoreRequest
from minillm.metrics.stats import IterationStats
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class DeltaOutput:
    """What one step added to a request: its new text and token ids; on the last one, why it finished."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS, a stop token or a stop string) or "length", on the last output

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def find_stop_string(text: str, stop: tuple[str, ...], start: int) -> int:
    """Where the earliest of the stop strings begins in text at or after start, or -1."""
    return min((i for s in stop if (i := text.find(s, start)) != -1), default=-1)


class OutputCollector:
    """A request's outputs between the front end and its reader (vLLM's RequestOutputCollector). Outputs the reader
    has not taken yet are merged into one, so a slow reader costs the text it has not read, not an object a step."""

    def __init__(self):
        self.pending: DeltaOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, item: DeltaOutput | BaseException) -> None:
        pending = self.pending
        if isinstance(item, DeltaOutput) and isinstance(pending, DeltaOutput):
            item = DeltaOutput(pending.text + item.text, pending.token_ids + item.token_ids, item.finish_reason)
        elif isinstance(pending, BaseException):
            return  # an error (or the end of an aborted request) is final
        self.pending = item
        self.ready.set()

    async def get(self) -> DeltaOutput | BaseException:
        await self.ready.wait()
        item, self.pending = self.pending, None
        self.ready.clear()
        return item


class RequestState:
    """One request in the front end: its detokenizer, stop strings, collector and timestamps.

    With stop strings, the text is held back by one character less than the longest of them until it cannot be
    the start of one, so that a stop string split across tokens never reaches the client; once one appears, the
    text is cut before it and the request finishes with "stop" (vLLM's convention: the stop string is left out)."""

    def __init__(self, request: EngineCoreRequest, tokenizer: Tokenizer | None, stop: tuple[str, ...]):
        self.request_id, self.stop = request.request_id, stop
        self.prompt_token_ids = request.prompt_token_ids
        self.hold = max(map(len, stop), default=1) - 1
        skip = request.sampling_params.skip_special_tokens
        self.detokenizer = IncrementalDetokenizer(tokenizer, request.prompt_token_ids, skip) if tokenizer else None
        self.collector = OutputCollector()
        self.num_sent_chars = 0
        self.waiting = True  # counted in AsyncLLM's queue until its first token (or its end)
        self.arrival_time = time.perf_counter()
        self.last_token_time: float | None = None

    def process(self, output: EngineCoreOutput, now: float, stats: IterationStats) -> DeltaOutput:
        """The DeltaOutput for the tokens the step that ended at `now` gave this request (one, or several when the
        step kept drafts, chapter 13); adds to stats."""
        if self.last_token_time is None:
            stats.time_to_first_tokens_iter.append(now - self.arrival_time)
            stats.num_prompt_tokens += len(self.prompt_token_ids)
            stats.prefix_cache_queries += len(self.prompt_token_ids)
            stats.prefix_cache_hits += output.num_cached_tokens
        else:
            stats.inter_token_latencies_iter.append(now - self.last_token_time)
        self.last_token_time = now
        stats.num_generation_tokens += len(output.new_token_ids)
        finish_reason, text = output.finish_reason, ""
        if self.detokenizer is not None:
            searched = len(self.detokenizer.text) - self.hold  # a stop string may begin this far back
            for token in output.new_token_ids:
                self.detokenizer.add(token)
            text = self.detokenizer.text
            if self.stop and (cut := find_stop_string(text, self.stop, max(searched, 0))) != -1:
                text, finish_reason = text[:cut], "stop"
            end = len(text) if finish_reason else max(self.num_sent_chars, len(text) - self.hold)
            text, self.num_sent_chars = text[self.num_sent_chars : end], end
        if finish_reason:
            stats.e2e_latencies.append(now - self.arrival_time)
        return DeltaOutput(text, output.new_token_ids, finish_reason)


class RequestStream:
    """The outputs of one request, as an async iterator of DeltaOutput. Leaving it early (aclose(), abort(), a
    cancelled consumer task, or dropping it) calls `abort`, which stops the request and frees its KV blocks."""

    def __init__(self, state: RequestState, abort: Callable[[str], None]):
        self._state, self._abort_request = state, abort
        self.prompt_token_ids = state.prompt_token_ids
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> DeltaOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._state.collector.get()
        except BaseException:  # cancelled while waiting
            self.abort()
            raise
        if self.finished:  # aborted (by another task) while this consumer waited
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def abort(self) -> None:
        """Stop the request if it is unfinished: it yields nothing more (a consumer waiting for it stops too)."""
        if not self.finished:
            self.finished = True
            self._abort_request(self._state.request_id)
            self._state.collector.ready.set()

    async def aclose(self) -> None:
        self.abort()

    def __del__(self):  # dropped unfinished, by whatever thread collects it: nobody waits for it
        if not self.finished:
            self.finished = True
            self._abort_request(self._state.request_id)
