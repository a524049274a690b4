"""AsyncLLM: the asyncio front end (vLLM's vllm/v1/engine/async_llm.py) that a server drives.

On the caller's side of the client boundary it checks and tokenizes each request (the Processor), hands the token ids
to the engine core, and turns the core's new token ids into text as they come (incremental detokenizing, stop
strings, statistics), in a task on the event loop. The core runs steps meanwhile: on a thread of this process
(`AsyncLLM(llm)`), or in a process of its own (`AsyncLLM.from_engine_args(...)`, the server's way), so that none of
this work sits on a step's critical path.
"""

import asyncio
import time
from itertools import count

from minillm.engine.core_client import ThreadedCoreClient, start_front_end
from minillm.engine.exceptions import EngineDeadError, EngineError, QueueFullError
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.messages import EngineCoreOutputs
from minillm.engine.output_processor import DeltaOutput, OutputCollector, RequestState, RequestStream
from minillm.engine.parallel_sampling import child_requests
from minillm.engine.processor import Processor
from minillm.metrics.stats import IterationStats
from minillm.sampling_params import SamplingParams

__all__ = ["AsyncLLM", "DeltaOutput", "EngineDeadError", "EngineError", "QueueFullError", "RequestStream"]


class AsyncLLM:
    """async with AsyncLLM(LLM(), max_queue=64) as async_llm:
        async for out in async_llm.generate("Once upon a time", SamplingParams(max_tokens=32)):
            print(out.text, end="")

    Requests come from one event loop (the first that adds one). close() (or leaving `async with`) stops the engine
    core's thread or process; an in-process engine itself stays open, its owner closes it. stat_loggers get
    record(SchedulerStats, IterationStats) on the event loop after every step."""

    def __init__(self, engine: LLMEngine, max_queue: int = 256, stat_loggers=()):
        """engine's core, stepped by a thread of this process."""
        self.setup(ThreadedCoreClient(engine.engine_core), engine.processor, max_queue, stat_loggers)

    @classmethod
    def from_engine_args(
        cls, model=None, max_queue: int = 256, stat_loggers=(), data_parallel_size: int = 1, **kwargs
    ) -> "AsyncLLM":
        """The engine core in a process of its own (LLM(model, **kwargs)'s settings); this process keeps only the
        tokenizer. data_parallel_size > 1: that many cores, each new request sent to the least loaded (chapter
        15). Raises what LLM(...) would for a bad model or setting."""
        processor, client = start_front_end(model, data_parallel_size, **kwargs)
        self = cls.__new__(cls)
        self.setup(client, processor, max_queue, stat_loggers)
        return self

    def setup(self, client, processor: Processor, max_queue: int, stat_loggers) -> None:
        if not (isinstance(max_queue, int) and max_queue >= 1):
            raise ValueError(
                f"max_queue must be an integer >= 1 (requests waiting for their first token), got {max_queue!r}"
            )
        self.client, self.processor, self.max_queue = client, processor, max_queue
        self.tokenizer, self.config = processor.tokenizer, processor.config
        self.stat_loggers = list(stat_loggers)
        self.num_waiting = 0  # requests added and not yet given a token, as max_queue counts them
        self.closed: str | None = None  # why the front end stopped serving (close()), once it has
        self.requests: dict[str, RequestState] = {}
        self.request_ids = count()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.output_handler: asyncio.Task | None = None

    async def add_request(
        self, prompt: str | list[int], sampling_params: SamplingParams, stop: tuple[str, ...] | list[str] = ()
    ) -> RequestStream:
        """Check, tokenize and queue a request; its stream. Raises QueueFullError at once when max_queue requests
        are waiting, ValueError naming the problem for a bad request, EngineError when nothing can be served.
        `stop`: strings that end the output (left out of it), looked for in the detokenized text."""
        stop = tuple(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {list(stop)!r}")
        if stop and self.tokenizer is None:
            raise ValueError("stop strings need the tokenizer, and this engine has none (skip_tokenizer_init=True)")
        if not self.is_alive():
            raise EngineError(f"the engine is not serving: {self.error}")
        if self.num_waiting >= self.max_queue:
            raise QueueFullError(
                f"{self.num_waiting} requests are waiting for their first token (max_queue={self.max_queue}): "
                "retry later, or raise max_queue (--max-queue)"
            )
        request = self.processor.process(str(next(self.request_ids)), prompt, sampling_params)
        self.start()
        states, collector = [], OutputCollector()
        for index, child in enumerate(child_requests(request)):  # n > 1: one engine-core request per answer
            state = self.requests[child.request_id] = RequestState(child, self.tokenizer, stop, collector, index)
            states.append(state)
            self.num_waiting += 1
            self.client.add_request(child)
        return RequestStream(states, self.abort_threadsafe)

    async def generate(self, prompt: str | list[int], sampling_params: SamplingParams, stop=()):
        """Yield the request's outputs as the engine produces them (an async generator over add_request)."""
        stream = await self.add_request(prompt, sampling_params, stop)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    async def run_in_engine(self, fn):
        """fn(engine_core), run between two steps on the in-process core's thread: the safe way to look at it while
        it serves (e.g. `lambda core: core.block_manager.num_free_blocks`)."""
        if not isinstance(self.client, ThreadedCoreClient):
            raise RuntimeError(
                "run_in_engine needs the engine core in this process: AsyncLLM(llm), not from_engine_args"
            )
        if not self.is_alive():
            raise EngineError(f"the engine is not serving: {self.error}")
        return await self.client.call(fn)

    @property
    def error(self) -> str | None:
        """Why nothing can be served, once that is so: close() was called, or the engine core is gone."""
        return self.closed or self.client.error

    def is_alive(self) -> bool:
        """False once the engine core is gone (a dead process, a failure) or close() was called."""
        return self.error is None

    def close(self) -> None:
        """Fail every unfinished request (its stream raises EngineError) and stop the engine core's thread or
        process."""
        self.closed = self.closed or "AsyncLLM was closed"
        if self.requests and self.client.error is None:  # an in-process core stays open: free their blocks
            self.client.abort_requests(list(self.requests))
        self.fail_all(EngineError(f"the engine is not serving: {self.error}"))
        self.client.shutdown()
        if self.output_handler is not None and not self.output_handler.done():
            self.output_handler.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    # the event loop's side

    def start(self) -> None:
        """Bind to the running event loop and start the output handler, once."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
            self.client.start(self.loop)
            self.output_handler = self.loop.create_task(self.handle_outputs())

    def abort_threadsafe(self, request_id: str) -> None:
        """Abort a request from any thread (a stream dropped by the garbage collector of another thread too)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop or self.loop is None:
            self.abort(request_id)
        elif not self.loop.is_closed():  # (a closed loop: nothing is served any more)
            self.loop.call_soon_threadsafe(self.abort, request_id)

    def abort(self, request_id: str) -> None:
        if (state := self.requests.pop(request_id, None)) is not None:
            self.leave_waiting(state)
            self.client.abort_requests([request_id])

    async def handle_outputs(self) -> None:
        """Take each step's outputs from the core and deliver them; if the core dies, fail every request."""
        try:
            while True:
                self.process_outputs(await self.client.get_output())
        except EngineDeadError as e:
            self.fail_all(e)

    def process_outputs(self, outputs: EngineCoreOutputs) -> None:
        """Detokenize each request's new tokens, cut stop strings (aborting the request in the core), deliver the
        texts, and record the step's statistics."""
        stats, now = IterationStats(), time.perf_counter()
        for output in outputs.outputs:
            if (state := self.requests.get(output.request_id)) is None:
                continue  # aborted meanwhile
            self.leave_waiting(state)
            if output.error:
                self.finish(state, EngineError(f"the engine step serving this request failed: {output.error}"))
                continue
            delta = state.process(output, now, stats)
            if delta.finished:
                self.finish(state, delta)
                if not output.finished:  # a stop string: the core would go on
                    self.client.abort_requests([output.request_id])
            else:
                state.collector.put(delta)
        for logger in self.stat_loggers:
            logger.record(outputs.scheduler_stats, stats, outputs.engine_index)

    def finish(self, state: RequestState, item: DeltaOutput | BaseException) -> None:
        self.requests.pop(state.request_id, None)
        state.collector.put(item)

    def fail_all(self, error: BaseException) -> None:
        for state in list(self.requests.values()):
            self.leave_waiting(state)
            self.finish(state, error)

    def leave_waiting(self, state: RequestState) -> None:
        if state.waiting:
            state.waiting, self.num_waiting = False, self.num_waiting - 1
