"""The server as `python -m minillm.serve` runs it: the front end in one process, the engine core in another
(MPClient, ZeroMQ). Killing the core mid-stream fails every client at once and turns /health to 503, with no process
or socket left; killing the front end takes the core with it; a 10 MB body sent while others stream is refused
without slowing their tokens."""

import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from minillm.models.hub import KNOWN_MODELS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the core process")


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def wait_until(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def serve(request):
    """`python -m minillm.serve` on a free loopback port (its model: the test's parameter, else the embedded one):
    (process, url, core pid); stopped after the test. Its sockets' directory is gone once it serves: the core is
    connected, and a front end killed from now on leaves nothing in /tmp."""
    model = ["--model", request.param] if hasattr(request, "param") else []
    before = set(Path(tempfile.gettempdir()).glob("minillm-*"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "minillm.serve", "--port", "0", *model],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in proc.stdout:
            if match := re.search(r"at (http://\S+)", line):
                break
        else:
            pytest.fail(f"the server did not start (exit code {proc.wait()})")
        (core,) = children(proc.pid)
        assert set(Path(tempfile.gettempdir()).glob("minillm-*")) <= before, "the sockets' directory is removed"
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its log
        yield proc, match.group(1), core
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def stream(url: str, events: list, max_tokens: int = 400) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append((time.monotonic(), line[6:]))


def test_a_killed_engine_core_fails_every_stream_and_the_server_says_so(serve):
    proc, url, core = serve
    streams = [[] for _ in range(4)]
    threads = [threading.Thread(target=stream, args=(url, events)) for events in streams]
    for thread in threads:
        thread.start()
    wait_until(lambda: all(len(events) >= 2 for events in streams))
    os.kill(core, signal.SIGKILL)
    killed = time.monotonic()
    for thread in threads:
        thread.join(30)
    for events in streams:
        errors = [json.loads(data)["error"] for _, data in events if data.startswith('{"error"')]
        assert errors and "engine core process died (exit code -9)" in errors[0]["message"], events[-3:]
        assert errors[0]["code"] == 500 and events[-1][1] == "[DONE]"
        assert events[-1][0] - killed < 5, "each client heard of it at once"
    health = httpx.get(url + "/health")
    assert health.status_code == 503 and "died" in health.json()["error"]["message"]
    response = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
    assert response.status_code in (500, 503) and "not serving" in response.json()["error"]["message"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0 and not alive(core)


def test_the_engine_core_dies_with_its_front_end(serve):
    proc, url, core = serve
    assert httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
    proc.kill()
    proc.wait(10)
    wait_until(lambda: not alive(core), timeout=10)


REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def send(url: str, body: bytes) -> tuple[float, bytes]:
    """POST a completion body as a client that sends it all before reading (what a careless client does): (seconds
    until the server's answer and its closed connection, the answer's status line)."""
    host, port = url.removeprefix("http://").split(":")
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        try:
            sock.sendall(body)
        except OSError:  # the server answered and closed before reading it all: the point
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return time.monotonic() - start, answer.split(b"\r\n")[0]


@pytest.mark.slow
@pytest.mark.skipif(KNOWN_MODELS[REAL_MODEL].source() is None, reason=KNOWN_MODELS[REAL_MODEL].pip)
@pytest.mark.parametrize("serve", [REAL_MODEL], indirect=True)
def test_a_10_mb_body_is_refused_without_delaying_running_streams(serve):
    """Four streams on SmolLM2-135M; while they run, a client sends a 10 MB body. It gets 413 before the body is
    read, and the connection is closed; each stream's worst gap between tokens around that time stays within 2x its
    median gap (a body read, parsed or tokenized on the server's event loop would show as one long gap)."""
    _, url, _ = serve
    streams = [[] for _ in range(4)]
    threads = [threading.Thread(target=stream, args=(url, events, 120)) for events in streams]
    for thread in threads:
        thread.start()
    body = json.dumps({"prompt": "a" * 10_000_000, "max_tokens": 4}).encode()  # made first: the GIL is the streams'
    wait_until(lambda: all(len(events) >= 20 for events in streams), timeout=120)
    start = time.monotonic()
    seconds, status = send(url, body)
    end = time.monotonic()
    for thread in threads:
        thread.join(120)
    assert status == b"HTTP/1.1 413 Request Entity Too Large" and seconds < 5
    for events in streams:
        times = [t for t, data in events if data != "[DONE]"]
        assert len(times) == 120, "every stream ran to its end"
        gaps = [(b - a, a, b) for a, b in zip(times, times[1:])]
        median = statistics.median(gap for gap, _, _ in gaps)
        during = [gap for gap, a, b in gaps if b >= start and a <= end + 0.5]  # and half a second after
        assert during and max(during) <= 2 * median, (max(during), median)


def test_front_ends_one_after_another_on_one_event_loop_each_serve():
    # a closed front end takes its socket off the event loop before the fd closes: the next one's socket may get
    # the same fd number, and before this it waited forever for outputs the loop never reported
    from minillm import SamplingParams
    from minillm.engine.async_llm import AsyncLLM

    async def first_text() -> str:
        async with AsyncLLM.from_engine_args(num_kvcache_blocks=16) as async_llm:
            stream = await async_llm.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=4))
            return "".join([out.text async for out in stream])

    async def three() -> list[str]:
        return [await asyncio.wait_for(first_text(), 60) for _ in range(3)]

    texts = asyncio.run(three())
    assert len(set(texts)) == 1 and texts[0]
