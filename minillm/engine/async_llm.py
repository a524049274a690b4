"""AsyncLLM: one LLMEngine serving requests that arrive at any time from asyncio code (vLLM's name).

A background thread owns the engine: it takes commands (add a request, abort one, run a function) from a
thread-safe queue between steps, runs `engine.step()` while requests are unfinished, and hands each request's
new text back to the event loop that asked for it with `loop.call_soon_threadsafe`. So the event loop never
waits on the model, and every engine call happens on that one thread.
"""

import asyncio
import queue
import threading
import time
from collections import defaultdict

from minillm.engine.llm_engine import LLMEngine
from minillm.engine.output_processor import (
    DeltaOutput,
    EngineError,
    IterationStats,
    QueueFullError,
    RequestState,
    RequestStream,
    SchedulerStats,
)
from minillm.sampling_params import SamplingParams
from minillm.spec_decode.metrics import SpecDecodingStats
from minillm.tokenizer import IncrementalDetokenizer


class AsyncLLM:
    """async with AsyncLLM(LLM(), max_queue=64) as async_llm:
        async for out in async_llm.generate("Once upon a time", SamplingParams(max_tokens=32)):
            print(out.text, end="")

    The engine thread starts with the first request and stops at close() (or leaving `async with`); the engine
    itself stays open, its owner closes it. stat_loggers get record(SchedulerStats, IterationStats) on the engine
    thread after every step (and every batch of commands)."""

    def __init__(self, engine: LLMEngine, max_queue: int = 256, stat_loggers=()):
        if not (isinstance(max_queue, int) and max_queue >= 1):
            raise ValueError(
                f"max_queue must be an integer >= 1 (requests waiting for their first token), got {max_queue!r}"
            )
        self.engine, self.max_queue, self.stat_loggers = engine, max_queue, list(stat_loggers)
        self.num_waiting = 0  # requests added and not yet given a token, as max_queue counts them
        self.error: str | None = None  # why the engine thread stopped serving, once it has
        # guards num_waiting, error and the thread's start and stop; reentrant, as a stream dropped while it is held
        # (a garbage collection) aborts its request through it
        self._lock = threading.RLock()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[int, RequestState] = {}  # seq_id -> request; engine thread only
        self._thread: threading.Thread | None = None

    async def add_request(
        self, prompt: str | list[int], sampling_params: SamplingParams, stop: tuple[str, ...] | list[str] = ()
    ) -> RequestStream:
        """Queue a request and return its stream once the engine has checked and accepted it. Raises QueueFullError
        at once when max_queue requests are waiting, ValueError (the engine's message) for a bad request.
        `stop`: strings that end the output (left out of it), looked for in the detokenized text."""
        stop = tuple(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {list(stop)!r}")
        request = RequestState(prompt, sampling_params, stop)
        with self._lock:
            if self.error:
                raise EngineError(f"the engine is not serving: {self.error}")
            if self.num_waiting >= self.max_queue:
                raise QueueFullError(
                    f"{self.num_waiting} requests are waiting for their first token (max_queue={self.max_queue}): "
                    "retry later, or raise max_queue (--max-queue)"
                )
            self.num_waiting += 1
        stream = RequestStream(self, request)
        try:
            stream.prompt_token_ids = await self._submit(self._add, request)
        except BaseException:
            stream.abort()
            raise
        return stream

    async def generate(self, prompt: str | list[int], sampling_params: SamplingParams, stop=()):
        """Yield the request's outputs as the engine produces them (an async generator over add_request)."""
        stream = await self.add_request(prompt, sampling_params, stop)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    async def run_in_engine(self, fn):
        """fn(engine), run on the engine thread between two steps: the safe way to look at the engine while
        AsyncLLM drives it (e.g. `lambda e: e.block_manager.num_free_blocks`)."""
        return await self._submit(fn, self.engine)

    def is_alive(self) -> bool:
        """False once a failure stopped the engine thread (a closed engine, a bug) or close() was called."""
        return self.error is None

    def close(self) -> None:
        """Abort every unfinished request (its stream raises EngineError) and stop the engine thread."""
        with self._lock:
            self.error = self.error or "AsyncLLM was closed"
            thread, self._thread = self._thread, None
        if thread is not None:
            self._commands.put(None)
            thread.join()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    # the event loop's side: commands for the engine thread

    def _submit(self, fn, *args, wait: bool = True):
        """Queue fn(*args) for the engine thread; with wait, an asyncio future of its result (or exception)."""
        future = asyncio.get_running_loop().create_future() if wait else None
        with self._lock:
            if self.error:
                if wait:
                    raise EngineError(f"the engine is not serving: {self.error}")
                return None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
                self._thread.start()
            self._commands.put((fn, args, future))
        return future

    # the engine thread's side

    def _run(self) -> None:
        """The engine thread: commands, then a step while requests are unfinished. The stat loggers record each
        before its results go out, so /metrics already counts whatever a client has been told."""
        commands = []
        try:
            while True:
                commands = [self._commands.get()] if self.engine.is_finished() else []  # idle: sleep until asked
                while not self._commands.empty():
                    commands.append(self._commands.get())
                closing = None in commands  # close(): the commands before it run, then every request fails
                if closing:
                    commands = commands[: commands.index(None)]
                if commands:
                    results = [self._execute(*command) for command in commands]
                    commands = []
                    self._record(IterationStats())
                    for future, result, error in filter(None, results):
                        _call_soon(future.get_loop(), _settle, future, result, error)
                if closing:
                    self._stop("AsyncLLM was closed")
                    return
                if not self.engine.is_finished():
                    stats = IterationStats()
                    outputs = self._step(stats)
                    self._record(stats)
                    self._deliver(outputs)
        except BaseException as e:  # the engine closed after a failed step, or a bug: nothing more can be served
            with self._lock:
                self.error = self.error or f"{type(e).__name__}: {e}"
            self._stop(f"the engine stopped serving: {type(e).__name__}: {e}", commands)

    def _execute(self, fn, args, future):
        """Run one command; for a caller that waits, (future, result, exception) to settle its future with."""
        if future is None:
            fn(*args)
            return None
        try:
            return future, fn(*args), None
        except Exception as e:
            return future, None, e

    def _record(self, stats: IterationStats) -> None:
        scheduler_stats = SchedulerStats.of(self.engine)
        for logger in self.stat_loggers:
            logger.record(scheduler_stats, stats)

    def _add(self, request: RequestState) -> list[int]:
        try:
            if request.stop and self.engine.tokenizer is None:
                raise ValueError("stop strings need the tokenizer, and this engine has none (skip_tokenizer_init=True)")
            request.seq = self.engine.add_request(request.prompt, request.sampling_params)
        except Exception:
            self._leave_waiting(request)
            raise
        if self.engine.tokenizer is not None:
            request.detokenizer = IncrementalDetokenizer(self.engine.tokenizer, request.seq.token_ids)
        self._requests[request.seq.seq_id] = request
        return request.seq.token_ids[:]

    def _step(self, stats: IterationStats) -> list[tuple[RequestState, DeltaOutput]]:
        """One engine step; the outputs it made for AsyncLLM's requests (a failed step's requests get its error)."""
        preemptions, spec = self.engine.scheduler.num_preemptions, spec_counts(self.engine.spec_stats)
        try:
            updated, _ = self.engine.step()
        except Exception as e:  # rolled back by the engine: fail the requests of that step, serve the others
            if self.engine.closed:
                raise
            for seq in self.engine.failed_seqs:
                if (request := self._requests.get(seq.seq_id)) is not None:
                    error = EngineError(f"the engine step serving this request failed: {type(e).__name__}: {e}")
                    error.__cause__ = e
                    self._finish(request, error)
            return []
        finally:
            stats.num_preempted_reqs = self.engine.scheduler.num_preemptions - preemptions
            stats.spec_decode = tuple(b - a for a, b in zip(spec, spec_counts(self.engine.spec_stats)))
        now = time.perf_counter()
        outputs = []
        for seq in updated:
            if (request := self._requests.get(seq.seq_id)) is None:
                continue  # a request of the engine's other users
            self._leave_waiting(request)
            out = request.process(seq, now, stats)
            if out.finished:
                self._finish(request)
            outputs.append((request, out))
        return outputs

    def _finish(self, request: RequestState, error: BaseException | None = None) -> None:
        """Take the request out: abort its sequence if the engine has not finished it, deliver error if given."""
        if request.seq is not None:
            self._requests.pop(request.seq.seq_id, None)
            self.engine.abort_request(request.seq)
        self._leave_waiting(request)
        if error is not None:
            self._deliver([(request, error)])

    def _leave_waiting(self, request: RequestState) -> None:
        if request.waiting:
            request.waiting = False
            with self._lock:
                self.num_waiting -= 1

    def _deliver(self, items: list[tuple[RequestState, DeltaOutput | BaseException]]) -> None:
        """Hand outputs to their requests' event loops, one callback per loop per step."""
        by_loop = defaultdict(list)
        for request, item in items:
            by_loop[request.loop].append((request.queue, item))
        for loop, batch in by_loop.items():
            _call_soon(loop, _put_all, batch)

    def _stop(self, reason: str, unprocessed=()) -> None:
        """Fail every request, and every command not run, with EngineError(reason): the thread serves no more."""
        for request in list(self._requests.values()):
            self._finish(request, EngineError(reason))
        while not self._commands.empty():
            unprocessed = [*unprocessed, self._commands.get()]
        for command in unprocessed:
            if command is not None and command[2] is not None:
                _call_soon(command[2].get_loop(), _settle, command[2], None, EngineError(reason))


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # that event loop is closed: nobody is listening any more
        pass


def _settle(future: asyncio.Future, result, error) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(result)


def _put_all(batch) -> None:
    for q, item in batch:
        q.put_nowait(item)


def spec_counts(stats: SpecDecodingStats) -> tuple[int, int, int]:
    return stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens
