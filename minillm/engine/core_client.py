"""The client boundary (vLLM's vllm/v1/engine/core_client.py): how a front end reaches its engine core.

- `ThreadedCoreClient`: the core lives in this process and a background thread steps it (notebooks and tests:
  easy to watch; `LLM` itself calls its in-process core directly).
- `MPClient`: the core runs in a process of its own (`core_proc.py`); requests and outputs cross over ZeroMQ
  sockets as msgpack (msgspec). The front end's work then never delays a step, and the core's steps never block
  the front end's event loop. A core process that dies is noticed at once, through its process sentinel.

- `DPLBAsyncMPClient` (dp_client.py): several such core processes, each request to the least loaded (chapter 15).

All give the front end the same asyncio-side calls: add_request, abort_requests (fire and forget), and
`await get_output()` for each step's EngineCoreOutputs, which raises EngineDeadError once the core is gone.
`start_front_end` makes the front end's side for a server: the Processor and a client of core processes.
"""

import asyncio
import queue
import threading

from minillm.engine.core import EngineCore
from minillm.engine.core_proc import MPClient
from minillm.engine.dp_client import DPLBAsyncMPClient
from minillm.engine.exceptions import EngineDeadError
from minillm.engine.llm_engine import engine_config, eos_token_ids
from minillm.engine.messages import EngineCoreOutputs, EngineCoreRequest
from minillm.engine.processor import Processor
from minillm.platforms import cpu_threads_per_rank
from minillm.tokenizer import Tokenizer


class ThreadedCoreClient:
    """An in-process EngineCore stepped by a thread: it takes commands between steps (add, abort, a function to
    run on the core) and hands each step's outputs to the event loop that started it."""

    num_engines = 1

    def __init__(self, engine_core: EngineCore):
        self.engine_core = engine_core
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.outputs: asyncio.Queue | None = None
        self.thread: threading.Thread | None = None
        self.error: str | None = None  # why the thread stopped, once it has

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to `loop` (outputs go to it) and start the thread, once."""
        if self.thread is None:
            self.loop, self.outputs = loop, asyncio.Queue()
            self.thread = threading.Thread(target=self.run, name="minillm-engine", daemon=True)
            self.thread.start()

    def add_request(self, request: EngineCoreRequest) -> None:
        self.commands.put((self.engine_core.add_request, request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.commands.put((self.engine_core.abort_requests, request_ids))

    async def call(self, fn):
        """fn(engine_core), run on the engine thread between two steps (at once while no thread runs)."""
        if self.thread is None:
            return fn(self.engine_core)
        future = asyncio.get_running_loop().create_future()  # on the caller's loop, whichever that is
        self.commands.put((fn, self.engine_core, future))
        return await future

    async def get_output(self) -> EngineCoreOutputs:
        item = await self.outputs.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def shutdown(self) -> None:
        if self.thread is not None:
            self.commands.put(None)
            self.thread.join()

    def run(self) -> None:
        """The engine thread: commands, then a step while requests are unfinished, until shutdown()."""
        core = self.engine_core
        try:
            while True:
                commands = [] if core.has_unfinished_requests() else [self.commands.get()]  # idle: sleep
                while not self.commands.empty():
                    commands.append(self.commands.get())
                for command in commands:
                    if command is None:
                        return
                    self.execute(*command)
                if core.has_unfinished_requests():
                    self.deliver(core.step())
                elif commands:  # idle again (aborts): the queues and the cache as they are now
                    self.deliver(EngineCoreOutputs(scheduler_stats=core.stats()))
        except BaseException as e:  # an interrupt, a lost worker, a bug: nothing more can be served
            self.error = f"{type(e).__name__}: {e}"
            self.deliver(EngineDeadError(f"the engine stopped serving: {self.error}"))

    def execute(self, fn, arg, future=None) -> None:
        if future is None:
            fn(arg)
            return
        try:
            result, error = fn(arg), None
        except Exception as e:
            result, error = None, e
        future.get_loop().call_soon_threadsafe(settle, future, result, error)

    def deliver(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:  # that event loop is closed: nobody is listening any more
            pass


def settle(future: asyncio.Future, result, error) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(result)


def start_front_end(model=None, data_parallel_size: int = 1, **kwargs):
    """A Processor (with the tokenizer) in this process and a client whose core process holds the model: an
    MPClient, or with data_parallel_size > 1 a DPLBAsyncMPClient over that many cores (the CPU's cores split
    between them)."""
    if not (isinstance(data_parallel_size, int) and data_parallel_size >= 1):
        raise ValueError(f"data_parallel_size must be an integer >= 1 (engine cores), got {data_parallel_size!r}")
    config, path, model_config = engine_config(model, **kwargs)
    tokenizer = None if config.skip_tokenizer_init else Tokenizer(path)
    processor = Processor(config, path, model_config, tokenizer)
    eos = eos_token_ids(path, model_config, tokenizer)
    if data_parallel_size == 1:
        client = MPClient(config, path, eos)
    else:
        threads = cpu_threads_per_rank(data_parallel_size) if config.device == "cpu" else None
        client = DPLBAsyncMPClient(config, path, eos, data_parallel_size, threads)
    processor.num_kvcache_blocks = client.num_kvcache_blocks
    return processor, client
