"""Replicas behind vllm-router (`python -m minillm.replicas`): two independent minillm servers behind vLLM's load
balancer answer the official openai client with the tokens one engine gives; kill -9 of one replica during 100
non-streamed requests loses none of them (the router retries what the dead replica failed on the other), streams it
was answering end with an error (never a quiet, short answer), the dead replica is restarted and taken back; every
process and port is gone after."""

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from minillm import LLM, SamplingParams
from minillm.entrypoints.replicas import Replicas, router_command

pytestmark = pytest.mark.slow
PROMPTS = [f"Once upon a time, a {animal} named {name}" for animal in ("fox", "cat") for name in ("Tom", "Lily", "Max")]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_router_gets_fast_health_checks_and_retries():
    argv = router_command(8000, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware", 9000)
    flags = {flag: value for flag, value in zip(argv, argv[1:]) if flag.startswith("--")}
    assert flags["--policy"] == "cache_aware" and flags["--port"] == "8000" and flags["--prometheus-port"] == "9000"
    assert int(flags["--health-check-interval-secs"]) <= 1 and int(flags["--retry-max-retries"]) >= 2
    workers = argv.index("--worker-urls") + 1
    assert argv[workers : workers + 2] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    with pytest.raises(ValueError, match="policy must be one of"):
        Replicas(2, "fastest")


def policy_decisions(replicas: Replicas) -> list[float]:
    """The router's count of requests it sent to each replica."""
    counts = dict.fromkeys(replicas.replica_urls, 0.0)
    for line in replicas.router_metrics().splitlines():
        if line.startswith("vllm_router_policy_decisions_total"):
            worker = line.split('worker="')[1].split('"')[0]
            counts[worker] = float(line.split()[-1])
    return list(counts.values())


def test_replicas_behind_a_cache_aware_router_answer_the_openai_client():
    expected = LLM().generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    with Replicas(2, "cache_aware", ["--enforce-eager"]) as replicas:
        client = openai.OpenAI(base_url=replicas.url + "/v1", api_key="unused", max_retries=0)
        for prompt, ref in zip(PROMPTS, expected):
            out = client.completions.create(model="default", prompt=prompt, max_tokens=16, temperature=0)
            assert out.choices[0].text == ref.text
        stream = client.completions.create(
            model="default", prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == expected[0].text
        assert sum(policy_decisions(replicas)) == len(PROMPTS) + 1
        procs, ports = [replicas.router, *replicas.procs], [replicas.port, *replicas.ports]
    assert all(p.poll() is not None for p in procs), "every process stopped"
    assert all(port_free(port) for port in ports), "every port free"


def test_a_replica_killed_under_load_loses_no_request_and_is_taken_back():
    with Replicas(2, "round_robin", ["--enforce-eager"], restart_dead=True) as replicas:

        def complete(i: int) -> int:
            body = {"prompt": f"{PROMPTS[i % 6]} {i}", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
            return httpx.post(replicas.url + "/v1/completions", json=body, timeout=120).status_code

        def stream(events: list) -> None:
            body = {"prompt": PROMPTS[0], "max_tokens": 400, "ignore_eos": True, "stream": True}
            try:
                with httpx.stream("POST", replicas.url + "/v1/completions", json=body, timeout=120) as response:
                    events.extend(line for line in response.iter_lines() if line)
            except httpx.RemoteProtocolError as e:  # the replica died mid-answer: the router cuts the stream
                events.append(e)

        streams = [[] for _ in range(4)]
        with ThreadPoolExecutor(20) as pool:
            for events in streams:
                pool.submit(stream, events)
                time.sleep(0.1)
            while min(map(len, streams)) < 2:  # every stream has its first tokens
                time.sleep(0.05)
            on_killed = policy_decisions(replicas)[1]  # the streams the router sent to replica 1
            futures = [pool.submit(complete, i) for i in range(100)]
            time.sleep(0.5)  # requests in flight on both replicas
            assert not any("data: [DONE]" in events for events in streams), "a stream ended before the kill"
            replicas.kill(1)
            killed = time.monotonic()
            statuses = [f.result() for f in futures]
        assert statuses == [200] * 100, "the router retried what the dead replica failed on the other"
        assert 1 <= on_killed <= 3, "round robin sent streams to both replicas"
        ends = [events[-1] for events in streams]
        cut = [end for end in ends if isinstance(end, httpx.RemoteProtocolError)]
        assert len(cut) == on_killed, ends  # mid-answer on the dead replica: an error, never a quiet end
        for events in streams:  # ... and every other stream whole
            if events[-1] == "data: [DONE]":
                assert '"finish_reason":"length"' in events[-2].replace(" ", ""), events[-2]
        deadline = time.monotonic() + 180
        while not replicas.restarts:
            assert time.monotonic() < deadline, "the dead replica was not restarted"
            time.sleep(0.2)
        print(f"replica 1 healthy again {replicas.restarts[0] - killed:.1f} s after the kill")
        assert replicas.healthy() == [True, True]
        before, deadline = policy_decisions(replicas)[1], time.monotonic() + 60
        while policy_decisions(replicas)[1] == before:  # the router takes it back once its health checks pass
            assert time.monotonic() < deadline, "the router never sent to the restarted replica"
            with ThreadPoolExecutor(4) as pool:
                assert list(pool.map(complete, range(4))) == [200] * 4
        procs = [replicas.router, *replicas.procs]
    assert all(p.poll() is not None for p in procs), "every process stopped"
