"""Data parallelism inside one server (`python -m minillm.serve --data-parallel-size 2`): two engine-core processes
behind one front end. 64 concurrent streams are served by both cores with the tokens one engine gives, /metrics
labels each core's series engine="0" and engine="1", and a core killed under load is replaced: requests it had not
started are served by the other, the ones it was generating end with an error that says so, and the new core
serves again; every process is gone after."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minillm import LLM, SamplingParams
from minillm.engine.dp_client import choose_engine
from minillm.engine.exceptions import EngineDeadError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the core processes")
PROMPTS = [f"Once upon a time, a {animal} named {name}" for animal in ("fox", "cat", "bird", "frog") for name in
           ("Tom", "Lily", "Max", "Sue")]  # fmt: skip


def test_the_least_loaded_engine_gets_the_request_waiting_counting_four_times():
    assert choose_engine([(0, 0), (0, 0)]) == 0  # ties: the lowest index
    assert choose_engine([(2, 0), (0, 5)]) == 1  # 8 against 5
    assert choose_engine([(0, 3), (1, 0)]) == 0  # 3 against 4
    assert choose_engine([None, (9, 9)]) == 1  # a dead or starting core gets nothing
    with pytest.raises(EngineDeadError, match="no engine core is serving"):
        choose_engine([None, None])


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def wait_until(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


@pytest.fixture(scope="module")
def dp_server():
    """`python -m minillm.serve --data-parallel-size 2` on a free loopback port: (process, url)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "minillm.serve", "--port", "0", "--data-parallel-size", "2", "--enforce-eager"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = []
    try:
        for line in proc.stdout:
            log.append(line)
            if match := re.search(r"at (http://\S+)", line):
                break
        else:
            pytest.fail(f"the server did not start (exit code {proc.wait()}):\n{''.join(log)}")
        threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()  # keep draining its log
        yield proc, match.group(1), log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert proc.returncode == 0


def engine_series(url: str, name: str) -> dict[str, float]:
    """engine label -> value of the sample `name` on /metrics."""
    text = httpx.get(url + "/metrics").text
    return {
        s.labels["engine"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def complete(url: str, prompt: str, max_tokens: int, stream: bool = False) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if not stream:
        return httpx.post(url + "/v1/completions", json=body, timeout=120).json()
    text, error = [], None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]["message"]
                else:
                    text.append(event["choices"][0]["text"])
    return {"text": "".join(text), "error": error}


def test_64_streams_are_shared_by_both_cores_with_one_engines_tokens(dp_server):
    proc, url, _ = dp_server
    cores = children(proc.pid)
    assert len(cores) == 2, "one process per engine core"
    expected = [o.text for o in LLM().generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)]
    prompts = PROMPTS * 4
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda p: complete(url, p, 24, stream=True), prompts))
    assert [a["error"] for a in answers] == [None] * 64
    assert [a["text"] for a in answers] == expected * 4
    generated = engine_series(url, "vllm:generation_tokens_total")
    assert set(generated) == {"0", "1"} and min(generated.values()) > 0, generated  # both cores served
    assert sum(generated.values()) >= 64 * 24 - 64  # (a request may stop early at EOS)
    assert set(engine_series(url, "vllm:num_requests_running")) == {"0", "1"}


def test_a_killed_core_is_replaced_and_its_unstarted_requests_served_by_the_other(dp_server):
    proc, url, log = dp_server
    first = children(proc.pid)
    results = []
    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(complete, url, PROMPTS[i % 16], 200, stream=True) for i in range(24)]
        wait_until(lambda: engine_series(url, "vllm:generation_tokens_total").get("1", 0) > 100)
        os.kill(first[1], signal.SIGKILL)
        killed = time.monotonic()
        results = [f.result() for f in futures]
    failed = [r for r in results if r["error"]]
    assert all("engine core 1 died while generating this request" in r["error"] for r in failed), failed[:2]
    assert len(failed) < len(results), "the other core's requests are served"
    assert all(not r["error"] and r["text"] for r in results if r not in failed)
    # the replacement: a new process, serving again
    wait_until(lambda: any("engine core 1 restarted" in line for line in log))
    print(f"core 1 serves again {time.monotonic() - killed:.1f} s after the kill")
    replaced = children(proc.pid)
    assert len(replaced) == 2 and first[0] in replaced and first[1] not in replaced
    before = engine_series(url, "vllm:generation_tokens_total")["1"]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: complete(url, p, 8), PROMPTS[:8]))
    assert all(a["choices"][0]["text"] for a in answers)
    assert engine_series(url, "vllm:generation_tokens_total")["1"] > before, "the new core takes requests"
    assert httpx.get(url + "/health").status_code == 200
    assert any("engine core 1 died" in line for line in log)
