"""Data parallelism inside one server (vLLM's DPLBAsyncMPClient): N engine cores, each a process with its own
scheduler, KV cache and copy of the model, behind one front end that sends each new request to the least loaded.

The load of a core is what its last step reported (SchedulerStats: requests waiting and running), plus the requests
sent to it since; a waiting request counts four times a running one, as vLLM's internal load balancer counts them
(it will need a whole prefill before it even starts). A core that dies is replaced: the requests it had not given a
token yet go to the others (nothing lost), the ones it was generating fail with an error that says so, and a new
core process starts in the background and takes requests again once it is ready.
"""

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from functools import partial

from msgspec.structs import replace

from minillm.engine.core_proc import MPClient
from minillm.engine.exceptions import EngineDeadError
from minillm.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from minillm.metrics.stats import SchedulerStats

logger = logging.getLogger("minillm")
WAITING_WEIGHT = 4  # vLLM's: a waiting request weighs as much as four running ones


def choose_engine(loads: list[tuple[int, int] | None]) -> int:
    """The index of the engine core a new request goes to: the least loaded (vLLM's internal load balancer).

    loads[i] is engine i's (waiting, running): the requests it has queued and the ones it is generating, as its
    last step reported plus the requests sent to it since; None for an engine that is not serving (dead, or a
    replacement still starting), which gets nothing. An engine's score is WAITING_WEIGHT * waiting + running
    (WAITING_WEIGHT = 4: a waiting request still needs its whole prefill); return the index of the lowest score,
    the lowest index among equal scores. When every entry is None, raise EngineDeadError (the front end then
    fails the request) with a message that says no engine core is serving.

    Examples: [(2, 0), (0, 5), None] -> 1 (scores 8 and 5); [(0, 3), (1, 0)] -> 0 (3 against 4);
    [(0, 0), (0, 0)] -> 0 (a tie); [None, None] raises EngineDeadError.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 15.2: least-loaded engine core — score 4 x waiting + running, skip the dead, lowest index on ties
    scores = [(WAITING_WEIGHT * w + r, i) for i, load in enumerate(loads) if load is not None for w, r in [load]]
    if not scores:
        raise EngineDeadError("no engine core is serving: all have died and none has restarted yet")
    return min(scores)[1]
    # END EXERCISE


@dataclass
class Engine:
    """One engine core and what the front end knows of it."""

    client: MPClient | None  # None while a replacement starts
    waiting: int = 0  # as its last step reported, plus requests sent since
    running: int = 0
    receive: asyncio.Future | None = None  # its pending get_output
    requests: dict[str, "Sent"] = field(default_factory=dict)  # unfinished requests sent to it


@dataclass
class Sent:
    request: EngineCoreRequest
    started: bool = False  # it has had a token: if its core dies now, the client has seen part of the answer


class DPLBAsyncMPClient:
    """The MPClient interface (add_request, abort_requests, get_output, start, shutdown, error) over
    `data_parallel_size` engine-core processes."""

    def __init__(self, config, path, eos_token_ids: list[int], data_parallel_size: int, threads: int | None = None):
        self.make_core = partial(MPClient, config, path, eos_token_ids, threads=threads)
        self.engines: list[Engine] = []
        self.closing, self.lock = False, threading.Lock()
        try:
            for _ in range(data_parallel_size):  # one at a time: each core's budget sees the others' memory
                self.engines.append(Engine(self.make_core()))
        except BaseException:
            self.shutdown()
            raise
        self.num_kvcache_blocks = min(e.client.num_kvcache_blocks for e in self.engines)
        self.num_engines = data_parallel_size
        self.loop: asyncio.AbstractEventLoop | None = None
        self.where: dict[str, int] = {}  # request id -> the engine it was sent to
        self.reports: list[EngineCoreOutputs] = []  # the failed requests of cores that died, to report
        self.restarts: list[threading.Thread] = []
        self.restarted: list[tuple[int, MPClient]] = []  # new cores, ready, for the event loop to take up
        self.joined = asyncio.Event()  # wakes get_output when a new core is ready

    @property
    def error(self) -> str | None:
        if self.closing:
            return "the engine cores were shut down"
        if all(e.client is None for e in self.engines) and not any(t.is_alive() for t in self.restarts):
            return "every engine core died and none could be restarted"
        return None

    def loads(self) -> list[tuple[int, int] | None]:
        return [(e.waiting, e.running) if e.client is not None else None for e in self.engines]

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.loop is None:
            self.loop = loop
            for engine in self.engines:
                engine.client.start(loop)

    def add_request(self, request: EngineCoreRequest) -> None:
        index = choose_engine(self.loads())
        engine = self.engines[index]
        engine.waiting += 1
        engine.requests[request.request_id] = Sent(request)
        self.where[request.request_id] = index
        engine.client.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        by_engine: dict[int, list[str]] = {}
        for request_id in request_ids:
            if (index := self.where.pop(request_id, None)) is not None:
                self.engines[index].requests.pop(request_id, None)
                by_engine.setdefault(index, []).append(request_id)
        for index, ids in by_engine.items():
            if (client := self.engines[index].client) is not None:
                client.abort_requests(ids)

    async def get_output(self) -> EngineCoreOutputs:
        """The next step's outputs of any core, tagged with its engine_index; after a core's death, the errors of
        the requests it was generating (the others are sent to the remaining cores)."""
        while True:
            self.take_up_restarted()
            if self.reports:
                return self.reports.pop(0)
            if self.error:
                raise EngineDeadError(self.error)
            for engine in self.engines:
                if engine.client is not None and engine.receive is None:
                    engine.receive = asyncio.ensure_future(engine.client.get_output())
            joined = asyncio.ensure_future(self.joined.wait())
            await asyncio.wait([joined, *(e.receive for e in self.engines if e.receive)], return_when="FIRST_COMPLETED")
            joined.cancel()
            for index, engine in enumerate(self.engines):
                if engine.receive is not None and engine.receive.done():
                    receive, engine.receive = engine.receive, None
                    try:
                        return self.received(index, receive.result())
                    except EngineDeadError as e:
                        self.on_death(index, engine.client.error or str(e))

    def received(self, index: int, outputs: EngineCoreOutputs) -> EngineCoreOutputs:
        engine = self.engines[index]
        if (stats := outputs.scheduler_stats) is not None:
            engine.waiting, engine.running = stats.num_waiting_reqs, stats.num_running_reqs
        for output in outputs.outputs:
            if (sent := engine.requests.get(output.request_id)) is not None:
                sent.started = True
                if output.finished:
                    engine.requests.pop(output.request_id)
                    self.where.pop(output.request_id, None)
        return replace(outputs, engine_index=index)

    def on_death(self, index: int, error: str) -> None:
        """Requests not started go to the other cores; the started ones fail; a new core starts."""
        engine = self.engines[index]
        engine.client.shutdown()
        engine.client, engine.waiting, engine.running = None, 0, 0
        lost, engine.requests, failed = engine.requests, {}, []
        for request_id, sent in lost.items():
            self.where.pop(request_id, None)
            if sent.started or all(load is None for load in self.loads()):
                message = f"engine core {index} died while generating this request ({error})"
                failed.append(EngineCoreOutput(request_id, [], "error", error=message))
            else:
                self.add_request(sent.request)
        logger.warning("engine core %d died (%s): %d of its requests moved to other cores, %d failed; restarting it",
                       index, error, len(lost) - len(failed), len(failed))  # fmt: skip
        self.reports.append(EngineCoreOutputs(failed, SchedulerStats(0, 0, 0.0), engine_index=index))
        # the process from this thread, which lives as long as the server (a core dies with the thread that started
        # it); its wait for the model to load on a thread of its own
        client = self.make_core(wait=False)
        thread = threading.Thread(target=self.restart, args=(index, client), name=f"minillm-restart-{index}")
        self.restarts = [t for t in self.restarts if t.is_alive()] + [thread]
        thread.start()

    def restart(self, index: int, client: MPClient) -> None:
        """A thread: wait for engine `index`'s new core to load (seconds), then hand it to the event loop."""
        try:
            client.wait_ready()
        except Exception as e:
            logger.error("engine core %d could not be restarted: %s", index, e)
            return
        with self.lock:
            if self.closing:
                client.shutdown()
                return
            self.restarted.append((index, client))
        self.loop.call_soon_threadsafe(self.joined.set)

    def take_up_restarted(self) -> None:
        with self.lock:
            restarted, self.restarted = self.restarted, []
        for index, client in restarted:
            engine = self.engines[index]
            engine.client = client
            client.start(self.loop)
            logger.warning("engine core %d restarted: it serves again", index)
        self.joined.clear()

    def shutdown(self) -> None:
        with self.lock:
            self.closing = True
            restarted, self.restarted = self.restarted, []
        for thread in getattr(self, "restarts", ()):
            thread.join()
        for engine in self.engines:
            if engine.receive is not None:
                engine.receive.cancel()
            if engine.client is not None:
                engine.client.shutdown()
        for _, client in restarted:
            client.shutdown()
