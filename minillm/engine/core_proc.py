"""The engine core in a process of its own (vLLM's EngineCoreProc and MPClient): the server's way.

The front end starts the process (a fresh interpreter running `main`, as the tensor-parallel workers are: no
`__main__` guard needed), which builds the EngineCore, says it is ready (with its KV cache's size, which the front
end checks requests against), then loops: take the
requests and aborts that arrived on its ZeroMQ input socket, run a step while requests are unfinished, send the
step's outputs on its output socket, all as msgpack (msgspec). The front end notices a dead core at once (a thread
waiting on the process wakes its event loop), and the core never outlives the front end (Linux kills it with its
parent; elsewhere it checks its parent while idle).
"""

import asyncio
import ctypes
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import msgspec
import zmq
import zmq.asyncio

from minillm.engine.exceptions import EngineDeadError
from minillm.engine.messages import EngineCoreOutputs, EngineCoreRequest

STARTUP_TIMEOUT = 600  # seconds for the core to load its model (a first torch.compile may take minutes)
IDLE_POLL_MS = 500  # an idle core checks its parent this often


class MPClient:
    num_engines = 1

    def __init__(self, config, path, eos_token_ids: list[int], threads: int | None = None, wait: bool = True):
        """threads: torch's threads in the core's process (None: torch's default, every core of the CPU). wait False:
        return once the process is started, and call wait_ready() (from any thread) before using the client. Start
        it from a thread that lives as long as the core: Linux kills the core when the thread that started it ends
        (PR_SET_PDEATHSIG follows the parent thread)."""
        self.error: str | None = None  # why the core is gone, once it is
        self.ipc_dir = tempfile.mkdtemp(prefix="minillm-")
        addresses = (f"ipc://{self.ipc_dir}/input", f"ipc://{self.ipc_dir}/output")
        self.context = zmq.Context()  # the sockets are bound before the core connects to them
        self.input, output = self.context.socket(zmq.PUSH), self.context.socket(zmq.PULL)
        self.input.bind(addresses[0])
        output.bind(addresses[1])
        accepted = self.input.get_monitor_socket(zmq.EVENT_ACCEPTED)  # tells when the core has connected to input
        self.encoder, self.decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(EngineCoreOutputs)
        self.output: zmq.asyncio.Socket | None = None  # `output` for the event loop, once the core is ready
        self.starting = output, accepted
        self.dead: asyncio.Future | None = None
        self.proc = subprocess.Popen([sys.executable, "-c", CORE], stdin=subprocess.PIPE)
        self.proc.stdin.write(pickle.dumps((config, path, eos_token_ids, *addresses, os.getpid(), threads)))
        self.proc.stdin.close()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait until the core has built itself; raise its error (after stopping it) if it could not."""
        output, accepted = self.starting
        try:
            self.num_kvcache_blocks = wait_ready(self.proc, output)
        except BaseException:
            self.shutdown()
            raise
        # Both connections are made (the core's "ready" came through output). A connected socket needs no file, so
        # the directory goes now: a front end killed later (kill -9 runs no cleanup) leaves nothing in /tmp.
        if accepted.poll(10_000):
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
        self.input.disable_monitor()
        accepted.close(linger=0)
        self.output = zmq.asyncio.Socket.from_socket(output)  # awaited by the front end's output handler

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the core's process for `loop`: its exit wakes get_output at once."""
        if self.dead is None:
            self.dead = loop.create_future()
            watch = lambda: (self.proc.wait(), loop.is_closed() or loop.call_soon_threadsafe(self.on_exit))
            threading.Thread(target=watch, name="minillm-core-watch", daemon=True).start()

    def on_exit(self) -> None:
        self.error = self.error or f"the engine core process died (exit code {self.proc.returncode})"
        if not self.dead.done():
            self.dead.set_result(None)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.input.send(self.encoder.encode(("add", request)))

    def abort_requests(self, request_ids: list[str]) -> None:
        if self.error is None:
            self.input.send(self.encoder.encode(("abort", request_ids)))

    async def get_output(self) -> EngineCoreOutputs:
        recv = asyncio.ensure_future(self.output.recv())
        await asyncio.wait([recv, self.dead], return_when=asyncio.FIRST_COMPLETED)
        if not recv.done():
            recv.cancel()
            raise EngineDeadError(
                f"{self.error}: its unfinished requests failed; start a new engine (a server: restart it)"
            )
        return self.decoder.decode(recv.result())

    def shutdown(self, timeout: float = 5) -> None:
        """Ask the core to stop; terminate it, then kill it, if it does not in `timeout` seconds."""
        for stop in (lambda: self.input.send(self.encoder.encode(("shutdown", None))), self.proc.terminate):
            if self.proc.poll() is None:
                stop()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.output is not None:  # off the event loop before its fd closes: a later socket may get the same number
            self.output.close(linger=0)
        self.context.destroy(linger=0)
        self.error = self.error or "the engine core was shut down"
        shutil.rmtree(self.ipc_dir, ignore_errors=True)


def wait_ready(proc: subprocess.Popen, output: zmq.Socket) -> int:
    """The core's KV cache blocks, its first message once it has built itself; its error raised as ValueError."""
    for _ in range(STARTUP_TIMEOUT * 10):
        if output.poll(100):
            kind, value = msgspec.msgpack.decode(output.recv())
            if kind == "error":
                raise ValueError(value)
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"the engine core process died while starting (exit code {proc.returncode})")
    raise TimeoutError(f"the engine core did not start in {STARTUP_TIMEOUT} s")


CORE = "from minillm.engine.core_proc import main; main()"


def main() -> None:
    """The core process: its settings come pickled on stdin from the front end that started it."""
    run_engine_core(*pickle.load(sys.stdin.buffer))


def run_engine_core(
    config, path, eos_token_ids, input_address: str, output_address: str, parent_pid: int, threads: int | None
) -> None:
    """Build the EngineCore, then serve the front end until it says stop or goes away."""
    import torch

    from minillm.engine.core import EngineCore

    die_with_parent(parent_pid)
    if threads:
        torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the front end's to handle: it stops the core
    context = zmq.Context()
    input_socket, output_socket = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    input_socket.connect(input_address)
    output_socket.connect(output_address)
    try:
        core = EngineCore(config, path, eos_token_ids)
    except Exception as e:
        output_socket.send(msgspec.msgpack.encode(("error", f"{type(e).__name__}: {e}")))
        context.destroy(linger=1000)
        return
    output_socket.send(msgspec.msgpack.encode(("ready", core.model_runner.num_kvcache_blocks)))
    encoder, decode_message = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(tuple[str, msgspec.Raw]).decode
    decode_request, decode_ids = msgspec.msgpack.Decoder(EngineCoreRequest).decode, msgspec.msgpack.Decoder(list[str])
    try:
        while True:
            busy = core.has_unfinished_requests()
            if input_socket.poll(0 if busy else IDLE_POLL_MS):
                while True:
                    try:
                        kind, payload = decode_message(input_socket.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if kind == "shutdown":
                        return
                    if kind == "add":
                        core.add_request(decode_request(payload))
                    else:
                        core.abort_requests(decode_ids.decode(payload))
            elif not busy and os.getppid() != parent_pid:
                return  # the front end is gone
            if core.has_unfinished_requests():
                output_socket.send(encoder.encode(core.step()))
            elif busy:  # idle again (aborts): the queues and the cache as they are now
                output_socket.send(encoder.encode(EngineCoreOutputs(scheduler_stats=core.stats())))
    except BaseException as e:
        print(f"minillm engine core: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    finally:
        core.close()
        context.destroy(linger=0)


def die_with_parent(parent_pid: int) -> None:
    """On Linux, have the kernel kill this process when its parent dies (even by kill -9)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before the call
            os._exit(0)
