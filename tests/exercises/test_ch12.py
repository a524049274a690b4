"""Chapter 12 exercises: the server-sent events of a streamed answer (12.1), a percentile read off a Prometheus
histogram (12.2).

Your generator frames hand-made outputs (each event's JSON, the usage event, an engine failure part-way, a client
that leaves), then serves a real request: minillm's app, on the embedded model, answers a streamed completion
through your code, and its pieces must add up to LLM.generate's text. Your quantile is checked on hand-made
buckets and against numpy on many samples in fine buckets, then drives the dashboard's p50/p99 panels.

    python -m minillm.course grade 12
"""

import asyncio
import math
from functools import partial
from json import loads

import httpx
import numpy as np
import pytest
from pytest import approx

from minillm import LLM, SamplingParams
from minillm.course import use_impl
from minillm.course.dashboard import HISTOGRAMS, Dashboard
from minillm.engine.async_llm import AsyncLLM, EngineError
from minillm.engine.output_processor import DeltaOutput
from minillm.entrypoints.openai.api_server import build_app, completion_chunk

OUTPUTS = [DeltaOutput("Once", [11]), DeltaOutput("", [12]), DeltaOutput(" upon", [13], "length")]


class FakeStream:
    """What a RequestStream offers the generator: outputs to iterate, the prompt's ids, abort()."""

    def __init__(self, outputs, fail_after=None):
        self.outputs, self.fail_after, self.prompt_token_ids, self.aborted = outputs, fail_after, [1, 2], 0

    async def __aiter__(self):
        for i, out in enumerate(self.outputs):
            if i == self.fail_after:
                raise EngineError("the step failed")
            yield out

    def abort(self):
        self.aborted += 1


def frame(impl, stream, with_token_ids=False, include_usage=True, take=None):
    """The events impl's sse_events yields (the first `take` of them, then the generator is closed)."""

    async def run():
        events = []
        gen = impl.sse_events(stream, partial(completion_chunk, "cmpl-1", "m", ""), with_token_ids, include_usage)
        async for event in gen:
            events.append(event)
            if len(events) == take:
                await gen.aclose()  # the client went away
                break
        return events

    return asyncio.run(run())


def payloads(events):
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in events), (
        f"every event is 'data: <payload>' and a blank line, got {events!r}"
    )
    return [e[len("data: ") : -2] for e in events]


@pytest.mark.exercise("12.1")
def test_events_frame_each_output_then_usage_then_done(impl):
    stream = FakeStream(OUTPUTS)
    data = payloads(frame(impl, stream))
    assert data[-1] == "[DONE]", "the last event is data: [DONE]"
    chunks = [loads(d) for d in data[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:2]] == ["Once", " upon"], (
        "an event per output with text or a finish reason; the empty unfinished one is skipped"
    )
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert chunks[2]["choices"] == [] and chunks[2]["usage"]["completion_tokens"] == 3, (
        "the usage event comes last and counts every output's tokens, sent or not"
    )
    assert all("prompt_token_ids" not in c for c in chunks), "without return_token_ids no token ids are sent"
    aborted = stream.aborted
    assert aborted == 1, "stream.abort() is called once at the end"


@pytest.mark.exercise("12.1")
def test_with_token_ids_every_output_is_sent_and_the_first_carries_the_prompt(impl):
    chunks = [loads(d) for d in payloads(frame(impl, FakeStream(OUTPUTS), with_token_ids=True))[:-1]]
    assert [c["choices"][0]["token_ids"] for c in chunks[:3]] == [[11], [12], [13]]
    assert chunks[0]["prompt_token_ids"] == [1, 2] and chunks[1]["prompt_token_ids"] is None, (
        "only the first event carries stream.prompt_token_ids"
    )
    data = payloads(frame(impl, FakeStream(OUTPUTS), include_usage=False))
    assert len(data) == 3 and all(loads(d)["usage"] is None for d in data[:-1]), (
        "no usage event unless include_usage"
    )


@pytest.mark.exercise("12.1")
def test_an_engine_failure_is_an_error_event_and_a_client_that_leaves_is_aborted(impl):
    stream = FakeStream(OUTPUTS, fail_after=1)
    data = payloads(frame(impl, stream))
    error = loads(data[1])["error"]
    assert error["code"] == 500 and "the step failed" in error["message"] and data[2] == "[DONE]", (
        "an EngineError part-way becomes an error event (APIError(500, ...).body()), then [DONE]"
    )
    aborted = stream.aborted
    assert aborted == 1
    stream = FakeStream(OUTPUTS)
    assert len(frame(impl, stream, take=1)) == 1
    aborted = stream.aborted
    assert aborted == 1, "closing the generator (the client left) must still call stream.abort()"


@pytest.mark.exercise("12.1")
def test_the_server_streams_through_your_events(impl):
    llm = LLM(num_kvcache_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=16)
    expected = llm.generate(["Once upon a time"], params, use_tqdm=False)[0].text

    async def stream_completion():
        async with AsyncLLM(llm) as async_llm:
            transport = httpx.ASGITransport(app=build_app(async_llm))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                body = dict(prompt="Once upon a time", max_tokens=16, temperature=0, stream=True)
                return (await client.post("/v1/completions", json=body)).text

    with use_impl(impl, "12.1"):
        text = asyncio.run(stream_completion())
    data = payloads([e + "\n\n" for e in text.split("\n\n") if e])
    assert data[-1] == "[DONE]"
    assert "".join(loads(d)["choices"][0]["text"] for d in data[:-1]) == expected
    free = llm.block_manager.num_free_blocks
    assert free == 64, "the request's KV blocks are freed"


@pytest.mark.exercise("12.2")
def test_histogram_quantile_on_hand_made_buckets(impl):
    buckets = [(0.1, 10.0), (0.5, 30.0), (math.inf, 40.0)]
    assert impl.histogram_quantile(0.5, buckets) == approx(0.3), "rank 20 lies halfway through (0.1, 0.5]"
    assert impl.histogram_quantile(0.25, buckets) == approx(0.1), "rank 10 is the first bucket's end"
    assert impl.histogram_quantile(0.05, buckets) == approx(0.02), "the first bucket starts at 0: rank 2 of 10"
    assert impl.histogram_quantile(0.9, buckets) == 0.5, "a rank in the +Inf bucket answers its lower bound"
    assert impl.histogram_quantile(0.99, [(0.1, 0.0), (0.5, 0.0), (math.inf, 0.0)]) is None, "nothing counted"
    assert impl.histogram_quantile(0.99, []) is None
    assert impl.histogram_quantile(0.0, [(0.1, 0.0), (0.5, 3.0), (math.inf, 3.0)]) == 0.1, (
        "rank 0 meets the empty first bucket: its le, not a division by zero"
    )


@pytest.mark.exercise("12.2")
def test_histogram_quantile_tracks_the_true_quantiles_of_many_samples(impl):
    samples = np.random.default_rng(0).lognormal(-3, 0.8, 20_000)  # latencies around 50 ms, a long tail
    edges = [*np.linspace(0.001, 1.0, 1000), math.inf]
    buckets = [(le, float((samples <= le).sum())) for le in edges]
    for q in (0.5, 0.9, 0.99):
        assert impl.histogram_quantile(q, buckets) == approx(np.quantile(samples, q), abs=0.002)


@pytest.mark.exercise("12.2")
def test_the_dashboards_percentiles_come_from_your_quantile(impl):
    dash = Dashboard("http://127.0.0.1:9", interval=60)  # nothing listens: no scrape, samples are made here
    dash.close()
    scrape = lambda n: {name: [(0.01, 0.0), (0.1, n), (math.inf, n)] for name in HISTOGRAMS.values()}
    dash.samples.extend([(0.0, scrape(0.0)), (5.0, scrape(100.0))])  # 100 latencies in (10, 100] ms
    with use_impl(impl, "12.2"):
        series = dash.series()
    assert series["ttft_p50_ms"][-1] == approx(55.0) and series["itl_p99_ms"][-1] == approx(99.1)
