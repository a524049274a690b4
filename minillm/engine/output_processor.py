"""OutputProcessor's side of a request (vLLM's vllm/v1/engine/output_processor.py): what the front end makes of the
engine core's new token ids for each request: its new text (detokenized incrementally, cut at a stop string), handed
to the caller through a collector that merges what a slow reader has not taken yet, and the statistics its metrics
are made of."""

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from minillm.engine.messages import EngineCoreOutput, EngineCoreRequest
from minillm.logprobs import Logprob
from minillm.metrics.stats import IterationStats
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class DeltaOutput:
    """What one step added to a request: its new text and token ids; on the last one, why it finished. With n > 1
    (chapter 16), `index` says which of the n answers it continues; with logprobs, one mapping per new token."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS, a stop token or a stop string) or "length", on the last output
    index: int = 0
    logprobs: list[dict[int, Logprob]] | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # on the first output, if asked: None first

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __add__(self, later: "DeltaOutput") -> "DeltaOutput":
        """This output and a later one of the same answer, as one."""
        logprobs = None if self.logprobs is None else self.logprobs + (later.logprobs or [])
        text, ids = self.text + later.text, self.token_ids + later.token_ids
        return DeltaOutput(text, ids, later.finish_reason, self.index, logprobs, self.prompt_logprobs)


def decode_logprobs(entries: list, tokenizer: Tokenizer | None) -> list[dict[int, Logprob]]:
    """The engine core's (ids, logprobs, rank) per token as one {token id: Logprob} per token, the chosen token
    first, each with its text."""
    text = (lambda i: tokenizer.decode([i], False)) if tokenizer else (lambda i: None)
    return [
        {i: Logprob(lp, rank if j == 0 else j, text(i)) for j, (i, lp) in enumerate(zip(ids, lps))}
        for ids, lps, rank in entries
    ]


def find_stop_string(text: str, stop: tuple[str, ...], start: int) -> int:
    """Where the earliest of the stop strings begins in text at or after start, or -1."""
    return min((i for s in stop if (i := text.find(s, start)) != -1), default=-1)


class OutputCollector:
    """A request's outputs between the front end and its reader (vLLM's RequestOutputCollector). Outputs the reader
    has not taken yet are merged into one per answer (index), so a slow reader costs the text it has not read, not
    an object a step. An error is final."""

    def __init__(self):
        self.pending: dict[int, DeltaOutput] | BaseException = {}
        self.ready = asyncio.Event()

    def put(self, item: DeltaOutput | BaseException) -> None:
        if isinstance(self.pending, BaseException):
            return  # an error (or the end of an aborted request) is final
        if isinstance(item, DeltaOutput):
            earlier = self.pending.get(item.index)
            self.pending[item.index] = item if earlier is None else earlier + item
        else:
            self.pending = item
        self.ready.set()

    async def get(self) -> DeltaOutput | BaseException | None:
        """The oldest answer's pending output (or the error)."""
        await self.ready.wait()
        if isinstance(self.pending, BaseException):
            item, self.pending = self.pending, {}
        else:  # (nothing, when woken by an abort)
            item = self.pending.pop(next(iter(self.pending))) if self.pending else None
        if not self.pending:
            self.ready.clear()
        return item


class RequestState:
    """One request in the front end: its detokenizer, stop strings, collector and timestamps.

    With stop strings, the text is held back by one character less than the longest of them until it cannot be
    the start of one, so that a stop string split across tokens never reaches the client; once one appears, the
    text is cut before it and the request finishes with "stop" (vLLM's convention: the stop string is left out)."""

    def __init__(
        self,
        request: EngineCoreRequest,
        tokenizer: Tokenizer | None,
        stop: tuple[str, ...],
        collector: OutputCollector | None = None,
        index: int = 0,
    ):
        """collector: shared by the n answers of a request with n > 1, of which this is answer `index`."""
        self.request_id, self.stop, self.index, self.tokenizer = request.request_id, stop, index, tokenizer
        self.prompt_token_ids = request.prompt_token_ids
        self.hold = max(map(len, stop), default=1) - 1
        skip = request.sampling_params.skip_special_tokens
        self.detokenizer = IncrementalDetokenizer(tokenizer, request.prompt_token_ids, skip) if tokenizer else None
        self.collector = collector or OutputCollector()
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
        logprobs = decode_logprobs(output.new_logprobs, self.tokenizer) if output.new_logprobs else None
        prompt = [None, *decode_logprobs(output.prompt_logprobs, self.tokenizer)] if output.prompt_logprobs else None
        return DeltaOutput(text, output.new_token_ids, finish_reason, self.index, logprobs, prompt)


class RequestStream:
    """The outputs of one request (of its n answers, chapter 16), as an async iterator of DeltaOutput. Leaving it
    early (aclose(), abort(), a cancelled consumer task, or dropping it) calls `abort` for each answer, which stops
    it and frees its KV blocks."""

    def __init__(self, states: list[RequestState], abort: Callable[[str], None]):
        self._states, self._abort_request = states, abort
        self._collector = states[0].collector
        self.prompt_token_ids = states[0].prompt_token_ids
        self.unfinished = {state.index for state in states}
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> DeltaOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._collector.get()
        except BaseException:  # cancelled while waiting
            self.abort()
            raise
        if self.finished:  # aborted (by another task) while this consumer waited
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.unfinished.discard(item.index)
        self.finished = not self.unfinished
        return item

    def abort(self) -> None:
        """Stop the request if it is unfinished: it yields nothing more (a consumer waiting for it stops too)."""
        if not self.finished:
            self.finished = True
            for state in self._states:
                self._abort_request(state.request_id)
            self._collector.ready.set()

    async def aclose(self) -> None:
        self.abort()

    def __del__(self):  # dropped unfinished, by whatever thread collects it: nobody waits for it
        if not self.finished:
            self.finished = True
            for state in self._states:
                self._abort_request(state.request_id)
