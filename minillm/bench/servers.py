"""The servers `python -m minillm.bench serve --launch` starts: minillm's (`python -m minillm.serve`) or vLLM's CPU
build (`python -m vllm.entrypoints.openai.api_server` from its own environment, as `vllm serve`), each a subprocess
on a free 127.0.0.1 port with the same engine flags, so that the two compare like with like.

launch() waits for /health (both servers have it) before it yields the address, and stops the server when its
block ends, however it ends (an error, Ctrl-C): SIGTERM, then SIGKILL for whatever of the server's process group
is left (vLLM's engine core is a child process). Should the bench itself be killed, the server gets SIGTERM from
the kernel (vllm_peer.die_with_parent). Its log goes to a temporary file, whose end is shown if it fails to start.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

import minillm
from minillm.bench import vllm_peer

SERVERS = ["minillm", "minillm-separate", "vllm"]  # minillm-separate: minillm without mixed steps (chapter 06)
START_TIMEOUT = 900  # seconds: vLLM starts in 25-80 s on a CPU, longer on a busy machine
STOP_TIMEOUT = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_flags(engine: dict) -> list[str]:
    """{"max_num_seqs": 8, "enforce_eager": True, ...} as vLLM's flags, which minillm.serve takes too:
    ["--max-num-seqs", "8", "--enforce-eager", ...]; a switch (True) alone, one that is False left out."""
    flag = lambda name: f"--{name.replace('_', '-')}"
    return [
        arg
        for name, value in engine.items()
        if value is not False
        for arg in ([flag(name)] if value is True else [flag(name), str(value)])
    ]


def command(
    server: str, model: str | None, checkpoint: Path, engine: dict, port: int, max_queue: int, venv: Path
) -> list[str]:
    """The server's command line. minillm gets the model as given (a hub id or a directory; none: the embedded
    model) and max_queue (a burst of requests all at once must not meet its limit; vLLM has none); vLLM gets the
    checkpoint directory, served under minillm's name for it, in fp32."""
    common = ["--host", "127.0.0.1", "--port", str(port), *engine_flags(engine)]
    if server.startswith("minillm"):
        model_flag = ["--model", model] if model else []
        separate = ["--no-mixed-steps"] if server == "minillm-separate" else []
        return [sys.executable, "-m", "minillm.serve", *model_flag, "--max-queue", str(max_queue), *common, *separate]
    vllm = [str(vllm_peer.python_of(venv)), "-I", "-m", "vllm.entrypoints.openai.api_server"]
    model_flags = ["--model", str(checkpoint), "--served-model-name", model or "default"]
    return [*vllm, *model_flags, "--dtype", "float32", "--seed", "0", *common]


def environment(server: str, threads: int) -> dict:
    """minillm's server imports this minillm; vLLM's gets vllm_peer's environment (its CPU threads, offline)."""
    if server == "vllm":
        return vllm_peer.environment(threads)
    root = str(Path(minillm.__file__).resolve().parents[1])
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def wait_healthy(process: subprocess.Popen, base_url: str, log: Path, timeout: float = START_TIMEOUT) -> float:
    """Poll /health until it answers 200: the seconds it took. RuntimeError, with the log's end, if the server
    exits first or does not answer in time."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if process.poll() is not None:
            raise RuntimeError(
                f"the server exited with status {process.returncode}; its log ends:\n{vllm_peer.tail(log)}"
            )
        try:
            if httpx.get(base_url + "/health", timeout=5).status_code == 200:
                return time.perf_counter() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"the server did not answer /health within {timeout:.0f} s; its log ends:\n{vllm_peer.tail(log)}"
    )


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (both servers finish cleanly on it), then SIGKILL to every process left in its group."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
    for _ in range(50):
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the group outlives its leader while a child is alive
        except ProcessLookupError:
            break
        time.sleep(0.1)
    process.wait()


@contextmanager
def launch(
    server: str, model: str | None, checkpoint: Path, engine: dict, max_queue: int, threads: int, venv: Path
) -> Iterator[dict]:
    """Start `server` (minillm or vllm) and yield {"base_url", "command", "startup_seconds"} once it is healthy;
    stopped, with every process of its own, when the block ends. engine: vLLM's flags by dest name
    ({"max_num_seqs": 8, ...})."""
    port = free_port()
    argv = command(server, model, checkpoint, engine, port, max_queue, venv)
    with tempfile.TemporaryDirectory(prefix=f"minillm-serve-{server}-") as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                argv,
                cwd=tmp,
                env=environment(server, threads),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: a Ctrl-C reaches the bench only, which stops it
                preexec_fn=vllm_peer.die_with_parent if sys.platform == "linux" else None,
            )
        try:
            base_url = f"http://127.0.0.1:{port}"
            print(f"{server}: starting its server on {base_url} ...", flush=True)
            seconds = wait_healthy(process, base_url, log)
            print(f"{server}: healthy after {seconds:.0f} s", flush=True)
            yield dict(base_url=base_url, command=argv, startup_seconds=seconds)
        except httpx.TransportError as e:  # a request could not reach it: say whether it is still there, and why
            state = "is running" if process.poll() is None else f"exited with status {process.returncode}"
            raise RuntimeError(
                f"{server}'s server on {base_url} {state} ({e}); its log ends:\n{vllm_peer.tail(log)}"
            ) from e
        finally:
            stop(process)
