"""The OpenAI-compatible server on a real loopback socket, driven by the official openai client and by httpx:
the text and tokens LLM.generate and LLM.chat give, streamed or whole; stop strings; 400s that name the field;
413 for a body over the limit, before it is read; a prompt too long refused before it is tokenized; 401 without
the API key; 429 on a full queue; 500 on a failed step, then service as before; 503 from /health once the engine
stops; a client that leaves frees its blocks; vLLM's metric names; `python -m minillm.serve` stopped by SIGINT or
SIGTERM."""

import asyncio
import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from fastapi import Request
from prometheus_client.parser import text_string_to_metric_families
from test_async_llm import straddling_stop  # tests/ is on sys.path

from minillm import LLM, SamplingParams, default_model_path
from minillm.engine.async_llm import AsyncLLM
from minillm.entrypoints.openai.api_server import build_app, exposure_warning, listen, url
from minillm.entrypoints.openai.serving import with_cancellation

PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me about a fox."}]
# a chat template for the story model (it has none): turns as "role: content" lines, then the answer's cue
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
TEMPLATE += "{% if add_generation_prompt %}assistant:{% endif %}"
GREEDY = SamplingParams(temperature=0, max_tokens=24)
BLOCKS = 64


class Server:
    """The app in uvicorn on a thread of this process, listening on a free loopback port; `options`: build_app's."""

    def __init__(self, async_llm: AsyncLLM, model_name: str, **options):
        self.async_llm = async_llm
        self.sock = listen("127.0.0.1", 0)
        self.url = url(self.sock)
        config = uvicorn.Config(build_app(async_llm, model_name, **options), lifespan="off", log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})
        self.thread.start()  # the socket listens already: requests wait in its backlog until uvicorn takes them

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        self.async_llm.close()
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("story-chat") / "model"
    shutil.copytree(default_model_path(), path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return LLM(path, num_kvcache_blocks=BLOCKS)


@pytest.fixture(scope="module")
def reference(llm):
    return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0], llm.chat(MESSAGES, GREEDY, use_tqdm=False)[0]


@pytest.fixture(scope="module")
def server(llm, reference):
    server = Server(AsyncLLM(llm, max_queue=64), "story")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def post(server, path, body, headers=None, **kwargs):
    """POST body as JSON, as Python's json writes it: Infinity and NaN included (httpx's json= refuses those)."""
    headers = {"content-type": "application/json"} | (headers or {})
    return httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=60, **kwargs)


def metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def engine_state(server):
    """(free blocks, all blocks, nothing unfinished), read on the engine thread."""
    return asyncio.run(
        server.async_llm.run_in_engine(
            lambda core: (core.block_manager.num_free_blocks, len(core.block_manager.blocks), not core.requests)
        )
    )


def wait_until(condition, timeout=30.0):
    """Poll a condition that another process or thread makes true (a server noticing a dropped client)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_greedy_completion_and_chat_equal_llm_generate_and_chat(client, reference, llm):
    ref, chat_ref = reference
    out = client.completions.create(
        model="story", prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"return_token_ids": True}
    )
    choice = out.choices[0]
    assert (choice.text, choice.token_ids, choice.finish_reason) == (ref.text, ref.token_ids, ref.finish_reason)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ref.prompt_token_ids), len(ref.token_ids))
    assert out.prompt_token_ids == ref.prompt_token_ids

    chat = client.chat.completions.create(model="story", messages=MESSAGES, max_completion_tokens=24, temperature=0)
    assert chat.choices[0].message.content == chat_ref.text and chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens == len(chat_ref.prompt_token_ids)
    prompt = llm.tokenizer.decode(chat_ref.prompt_token_ids)
    assert prompt.startswith("user: Tell me about a fox.") and prompt.endswith("assistant:")  # the template


# what vllm-router (chapter 15) adds to every request it forwards: vLLM's and SGLang's fields at their defaults
ROUTER_FIELDS = {"no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}
ROUTER_COMPLETION_FIELDS = ROUTER_FIELDS | {"echo": False}
ROUTER_CHAT_FIELDS = ROUTER_FIELDS | {"logprobs": False, "continue_final_message": False, "separate_reasoning": True,
                                     "stream_reasoning": True, "include_reasoning": True}  # fmt: skip


def test_a_routers_fields_change_nothing_and_echo_and_special_tokens_are_vllms(server, reference, llm):
    ref, chat_ref = reference
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    assert post(server, C, body | ROUTER_COMPLETION_FIELDS).json()["choices"][0]["text"] == ref.text
    chat = post(server, CHAT, {"messages": MESSAGES, "max_tokens": 24, "temperature": 0} | ROUTER_CHAT_FIELDS)
    assert chat.json()["choices"][0]["message"]["content"] == chat_ref.text

    # echo: the prompt's text first, whole or streamed (a prompt of token ids: their text)
    assert post(server, C, body | {"echo": True}).json()["choices"][0]["text"] == PROMPT + ref.text
    events = post(server, C, body | {"echo": True, "stream": True}).text.split("\n\n")
    chunks = [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT + ref.text
    ids = post(server, C, body | {"prompt": ref.prompt_token_ids, "echo": True}).json()["choices"][0]["text"]
    assert ids == llm.tokenizer.decode(ref.prompt_token_ids) + ref.text

    # skip_special_tokens false: the EOS that ends a story, and the prompt's BOS, appear in the text
    long = body | {"max_tokens": 300}
    kept = post(server, C, long | {"skip_special_tokens": False, "echo": True, "prompt": ref.prompt_token_ids})
    text, skipped = kept.json()["choices"][0]["text"], post(server, C, long).json()["choices"][0]["text"]
    assert text.startswith(llm.tokenizer.bos_token) and text.endswith(llm.tokenizer.eos_token)
    assert llm.tokenizer.eos_token not in skipped and skipped in text


def test_streamed_pieces_concatenate_to_the_same_text_with_usage_last(client, reference):
    ref, chat_ref = reference
    chunks = list(
        client.completions.create(
            model="story",
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(pieces) == ref.text and len(pieces) > 5
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason
    assert all(c.usage is None for c in chunks[:-1])

    stream = client.chat.completions.create(model="story", messages=MESSAGES, max_tokens=24, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream]
    assert deltas[0].role == "assistant" and "".join(d.content or "" for d in deltas) == chat_ref.text


def test_64_concurrent_streams_all_complete(server):
    async def one(client, i):
        body = {"prompt": f"{PROMPT} {i}", "max_tokens": 8, "ignore_eos": True, "stream": True}
        async with client.stream(
            "POST", "/v1/completions", json={**body, "stream_options": {"include_usage": True}}
        ) as r:
            events = [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: {")]
        return events[-1]["usage"]["completion_tokens"], sum(len(e["choices"]) for e in events)

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    assert all(tokens == 8 and 0 < chunks <= 8 for tokens, chunks in asyncio.run(main()))
    assert engine_state(server) == (BLOCKS, BLOCKS, True)


def test_stop_strings_are_cut_from_the_text(server, reference, llm):
    ref = reference[0]
    stop = straddling_stop(llm.tokenizer, ref.token_ids, ref.text)
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": stop}
    out = post(server, "/v1/completions", body).json()["choices"][0]
    assert (out["text"], out["finish_reason"]) == (ref.text[: ref.text.index(stop)], "stop")
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == out["text"]


LONG_PROMPT = "Once upon a time " * 200  # about 800 tokens: more than the model's 512 positions
# more characters than 512 tokens can spell (the longest token of the story model's vocabulary has 11)
TOO_MANY_CHARS = "a" * (512 * 11 + 1)
C, CHAT = "/v1/completions", "/v1/chat/completions"
GT_EQ = "Input should be greater than or equal to"


@pytest.mark.parametrize(
    "path, body, param, message",
    [
        (C, {"prompt": PROMPT, "temperature": -1}, "temperature", f"temperature: {GT_EQ} 0, got -1"),
        (C, {"prompt": PROMPT, "temperature": "hot"}, "temperature", "valid number"),
        (C, {"prompt": PROMPT, "temperature": math.inf}, "temperature", "finite number, got inf"),
        (C, {"prompt": ""}, "prompt", "prompt: String should have at least 1 character, got ''"),
        (C, {"prompt": []}, "prompt", "prompt: List should have at least 1 item"),
        (C, {"prompt": LONG_PROMPT, "max_tokens": 8}, "prompt", "exceeds max_model_len=512"),
        (C, {"prompt": TOO_MANY_CHARS}, "prompt", "the prompt has 5633 characters, more than the 5632"),
        (C, {"prompt": [1, 99999]}, "prompt", "unknown token ids [99999]"),
        (C, {"prompt": [1, -5]}, "prompt", f"prompt.1: {GT_EQ} 0, got -5"),
        (C, {"prompt": PROMPT, "n": 129}, "n", "n: Input should be less than or equal to 128, got 129"),
        (C, {"prompt": PROMPT, "top_p": 0}, "top_p", "top_p: Input should be greater than 0"),
        (C, {"prompt": PROMPT, "top_p": 1.5}, "top_p", "less than or equal to 1, got 1.5"),
        (C, {"prompt": PROMPT, "top_k": -2}, "top_k", f"top_k: {GT_EQ} -1, got -2"),
        (C, {"prompt": PROMPT, "top_k": 1281}, "top_k", "top_k must be at most the vocabulary size (1280"),
        (C, {"prompt": PROMPT, "top_k": 2.5}, "top_k", "valid integer"),
        (C, {"prompt": PROMPT, "seed": 2**63}, "seed", "less than or equal to 9223372036854775807"),
        (C, {"prompt": PROMPT, "seed": -(2**63) - 1}, "seed", f"{GT_EQ} -9223372036854775808"),
        (C, {"prompt": PROMPT, "seed": "7"}, "seed", "valid integer, got '7'"),
        (C, {"prompt": PROMPT, "max_tokens": 0}, "max_tokens", f"max_tokens: {GT_EQ} 1, got 0"),
        (C, {"prompt": PROMPT, "max_tokens": True}, "max_tokens", "valid integer, got True"),
        (C, {"prompt": PROMPT, "stop": [""]}, "stop", "at least 1 character"),
        (C, {"prompt": PROMPT, "stop": ["x"] * 65}, "stop", "at most 64 items"),
        (C, {"prompt": PROMPT, "stop": "x" * 257}, "stop", "at most 256 characters"),
        (C, {"prompt": PROMPT, "stop_token_ids": [-1]}, "stop_token_ids", f"stop_token_ids.0: {GT_EQ} 0"),
        (C, {"prompt": PROMPT, "stop_token_ids": [2] * 1025}, "stop_token_ids", "at most 1024 items"),
        (C, {"prompt": PROMPT, "stream_options": {"include_usage": "yes"}}, "stream_options", "valid boolean"),
        (C, {"prompt": PROMPT, "suffix": "The end."}, "suffix", "Extra inputs are not"),
        (C, {"prompt": PROMPT, "no_stop_trim": True}, "no_stop_trim", "stop string out of the text"),
        (C, {"prompt": PROMPT, "return_hidden_states": True}, "return_hidden_states", "no hidden states"),
        (C, {"prompt": PROMPT, "skip_special_tokens": "no"}, "skip_special_tokens", "valid boolean"),
        (CHAT, {"messages": MESSAGES, "logprobs": "yes"}, "logprobs", "valid boolean"),
        (CHAT, {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message", "new assistant"),
        (C, {"max_tokens": 8}, "prompt", "Field required"),
        (CHAT, {"messages": []}, "messages", "messages: List should have at least 1 item"),
        (CHAT, {"messages": [{"role": "user", "content": TOO_MANY_CHARS}]}, "messages", "5633 characters"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages", "'text', got 'image'"),
        (CHAT, {"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens", f"{GT_EQ} 1"),
        (C, {"prompt": PROMPT, "max_tokens": 512}, "max_tokens", "must be below max_model_len=512"),
        # max_completion_tokens wins, but a max_tokens beyond the context is refused still, as the schema says
        (CHAT, {"messages": MESSAGES, "max_tokens": 600, "max_completion_tokens": 2}, "max_tokens", "got 600"),
        ("/tokenize", {"prompt": TOO_MANY_CHARS}, "prompt", "the prompt has 5633 characters"),
        ("/tokenize", {}, "prompt", "give either a prompt (text) or messages"),
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt", "not both"),
        ("/detokenize", {"tokens": [5, -1]}, "tokens", f"tokens.1: {GT_EQ} 0, got -1"),
        ("/detokenize", {"tokens": [5, 1280]}, "tokens", "unknown token ids [1280]"),
    ],
)
def test_bad_requests_answer_400_naming_the_field(server, path, body, param, message):
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["type"], error["code"]) == (param, "BadRequestError", 400)
    assert message in error["message"]


def test_malformed_json_unknown_models_routes_and_methods_are_refused_in_openais_shape(server):
    response = httpx.post(
        server.url + "/v1/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = httpx.post(server.url + "/v1/completions", content=json.dumps({"prompt": PROMPT}))  # no content type
    assert response.status_code == 400 and "Content-Type: application/json" in response.json()["error"]["message"]
    response = post(server, "/v1/completions", {"model": "gpt-4", "prompt": PROMPT})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
    response = httpx.get(server.url + "/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["type"] == "NotFoundError"
    response = httpx.put(server.url + "/v1/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.json()["error"]["message"] == "PUT /v1/completions: the route takes POST only"


def test_a_tiny_temperature_is_sampled_at_vllms_minimum_and_seeds_span_int64(server):
    """A temperature in (0, 0.01) is raised to 0.01 (dividing logits by less overflows): with the same seed, the same
    draws as at 0.01. The extreme int64 seeds are served."""
    for seed in (-(2**63), 2**63 - 1):
        texts = [
            post(
                server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": t, "seed": seed}
            ).json()["choices"][0]["text"]
            for t in (1e-7, 0.01)
        ]
        assert texts[0] == texts[1]


def test_a_body_over_the_limit_gets_413_before_it_is_read(server):
    """Declared too large (Content-Length), or sent in chunks that pass the limit: 413 in OpenAI's shape, and the
    connection closed (the rest of the body is never read)."""
    body = json.dumps({"prompt": "a" * (1 << 20)}).encode()
    response = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.headers["connection"] == "close"
    error = response.json()["error"]
    assert error["type"] == "RequestTooLargeError" and f"has {len(body)} bytes" in error["message"]
    assert (
        "limit of 1048576: send a shorter prompt, or start the server with a larger --max-request-body-bytes"
        in (error["message"])
    )
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))  # no Content-Length: chunked encoding
    response = httpx.post(server.url + "/v1/completions", content=chunks, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "at least" in response.json()["error"]["message"]
    assert response.headers["connection"] == "close"
    assert post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_a_10_mb_prompt_is_refused_by_its_length_without_tokenizing(llm, monkeypatch):
    """With the body limit raised past it, a 10 MB prompt still costs no tokenizing: more characters than
    max_model_len tokens can spell is a 400 at once."""
    monkeypatch.setattr(llm.tokenizer, "encode", lambda *a, **k: pytest.fail("the prompt was tokenized"))
    server = Server(AsyncLLM(llm), "story", max_request_body_bytes=16 << 20)
    try:
        for path, body in (
            ("/v1/completions", {"prompt": "a" * 10_000_000}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * 10_000_000}]}),
        ):
            response = post(server, path, body)
            assert response.status_code == 400, response.text
            assert "the prompt has 10000000 characters, more than the 5632" in response.json()["error"]["message"]
    finally:
        server.stop()


def test_an_api_key_guards_every_route_but_health_metrics_and_the_docs(llm):
    server = Server(AsyncLLM(llm), "story", api_key="sesame")
    try:
        for path in ("/v1/models", "/v1/nothing"):
            response = httpx.get(server.url + path)
            assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["type"] == "AuthenticationError"
        for headers in ({"Authorization": "Bearer open"}, {"Authorization": "Basic sesame"}):
            assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 401
        assert post(server, "/tokenize", {"prompt": PROMPT}).status_code == 401
        key = {"Authorization": "Bearer sesame"}
        assert httpx.get(server.url + "/v1/models", headers=key).json()["data"][0]["id"] == "story"
        assert post(server, "/tokenize", {"prompt": PROMPT}, headers=key).status_code == 200
        for path in ("/health", "/metrics", "/openapi.json", "/docs"):
            assert httpx.get(server.url + path).status_code == 200, path
        schema = httpx.get(server.url + "/openapi.json").json()
        assert schema["components"]["securitySchemes"] == {"APIKey": {"type": "http", "scheme": "bearer"}}
        assert schema["paths"]["/v1/completions"]["post"]["security"] == [{"APIKey": []}]
        assert "security" not in schema["paths"]["/health"]["get"]
    finally:
        server.stop()


def test_health_answers_503_once_the_engine_has_stopped(llm):
    server = Server(AsyncLLM(llm), "story")
    try:
        assert httpx.get(server.url + "/health").status_code == 200
        server.async_llm.close()
        response = httpx.get(server.url + "/health")
        assert response.status_code == 503
        assert response.json()["error"]["message"] == "the engine is not serving: AsyncLLM was closed"
    finally:
        server.stop()


def test_with_cancellation_answers_499_once_the_handler_has_stopped():
    """A client that leaves before its whole answer: the handler is cancelled, its cleanup (the request's abort)
    has run when the wrapper returns, and the answer is a 499 rather than an InvalidStateError."""
    cleaned = []

    async def handler(request, raw_request):
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append("aborted")

    async def receive():
        return {"type": "http.disconnect"}

    raw_request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
    response = asyncio.run(with_cancellation(handler)(None, raw_request))
    assert response.status_code == 499 and cleaned == ["aborted"]


def test_a_server_reachable_from_other_machines_without_a_key_is_warned_about():
    assert exposure_warning("127.0.0.1", None) is exposure_warning("::1", None) is None
    assert exposure_warning("0.0.0.0", "sesame") is None
    assert "0.0.0.0 is reachable from other machines and no API key is set" in exposure_warning("0.0.0.0", None)


@pytest.fixture
def held_engine(server, llm, monkeypatch):
    """The engine core held at the start of its next step until released; `entered` once a request is in it."""
    entered, release, step = threading.Event(), threading.Event(), llm.engine_core.step

    def held_step():
        entered.set()
        release.wait(30)
        return step()

    monkeypatch.setattr(llm.engine_core, "step", held_step)
    yield entered, release
    release.set()


def test_a_full_queue_answers_429(server, held_engine, monkeypatch):
    entered, release = held_engine
    monkeypatch.setattr(server.async_llm, "max_queue", 1)
    first = {}
    body = {"prompt": PROMPT, "max_tokens": 8}
    thread = threading.Thread(target=lambda: first.update(r=post(server, "/v1/completions", body)))
    thread.start()
    assert entered.wait(30)  # the first request is in the engine, waiting for its first token
    response = post(server, "/v1/completions", body)
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["type"] == "RateLimitError" and "max_queue=1" in error["message"]
    release.set()
    thread.join(60)
    assert first["r"].status_code == 200


def test_a_failed_step_answers_500_and_the_server_serves_on(server, llm, reference, monkeypatch):
    runner = llm.model_runner
    run, calls = runner.run, []

    def fail_once(*args):
        calls.append(args)
        return 1 / 0 if len(calls) == 1 else run(*args)

    monkeypatch.setattr(runner, "run", fail_once)
    response = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "InternalServerError" and "ZeroDivisionError" in error["message"]
    assert httpx.get(server.url + "/health").status_code == 200
    response = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    assert response.json()["choices"][0]["text"] == reference[0].text
    assert engine_state(server) == (BLOCKS, BLOCKS, True)


def test_a_dropped_stream_is_aborted_and_frees_its_blocks(server):
    before = metrics(server)["vllm:generation_tokens_total"]
    body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # generating; then the client goes away
    wait_until(lambda: engine_state(server)[2])  # nothing unfinished: /metrics has recorded that already
    after = metrics(server)
    assert after["vllm:num_requests_running"] == after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:generation_tokens_total"] - before < 400  # stopped before its end
    assert engine_state(server) == (BLOCKS, BLOCKS, True)


def test_a_dropped_client_of_a_whole_answer_is_aborted(server, held_engine):
    entered, release = held_engine
    before = metrics(server)["vllm:generation_tokens_total"]
    body = json.dumps({"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    with socket.create_connection(server.sock.getsockname()[:2]) as conn:
        conn.sendall(head.encode() + b"\r\n\r\n" + body)
        assert entered.wait(30)  # the request is in the engine
    release.set()
    wait_until(lambda: engine_state(server)[2])
    assert metrics(server)["vllm:generation_tokens_total"] - before < 400
    assert engine_state(server) == (BLOCKS, BLOCKS, True)


def test_metrics_use_vllms_names_and_count_a_request(server):
    before = metrics(server)
    for _ in range(2):  # the second time, the prompt's full blocks come from the prefix cache
        post(server, "/v1/completions", {"prompt": PROMPT * 4, "max_tokens": 10, "temperature": 0, "ignore_eos": True})
    after = metrics(server)
    names = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total"]
    names += ["generation_tokens_total", "num_preemptions_total", "prefix_cache_queries_total"]
    names += ["prefix_cache_hits_total", "time_to_first_token_seconds_count", "inter_token_latency_seconds_count"]
    names += ["e2e_request_latency_seconds_count"]
    assert all(f"vllm:{name}" in after for name in names)
    delta = {name: after[f"vllm:{name}"] - before[f"vllm:{name}"] for name in names}
    prompt_len = len(server.async_llm.tokenizer.encode(PROMPT * 4))
    assert delta["prompt_tokens_total"] == delta["prefix_cache_queries_total"] == 2 * prompt_len
    assert 0 < delta["prefix_cache_hits_total"] <= prompt_len
    assert delta["generation_tokens_total"] == 20 and delta["inter_token_latency_seconds_count"] == 18
    assert delta["time_to_first_token_seconds_count"] == delta["e2e_request_latency_seconds_count"] == 2
    assert after["vllm:num_requests_running"] == after["vllm:kv_cache_usage_perc"] == 0


def test_tokenize_detokenize_and_models(server, llm, reference):
    tokens = post(server, "/tokenize", {"prompt": PROMPT}).json()
    assert tokens == {
        "count": len(reference[0].prompt_token_ids),
        "max_model_len": 512,
        "tokens": reference[0].prompt_token_ids,
    }
    assert post(server, "/detokenize", {"tokens": tokens["tokens"]}).json() == {"prompt": PROMPT}
    chat_tokens = post(server, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert chat_tokens == reference[1].prompt_token_ids
    models = httpx.get(server.url + "/v1/models").json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("story", 512)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_python_m_minillm_serve_stops_cleanly_on_a_signal(sig):
    process = subprocess.Popen(
        [sys.executable, "-m", "minillm.serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert "minillm serves default at http://127.0.0.1:" in line, line + process.stderr.read()
        address = line.split("at ")[1].split()[0]
        port = int(address.rsplit(":", 1)[1])
        assert httpx.get(address + "/health").status_code == 200
        text = httpx.post(address + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4}).json()
        assert text["usage"]["completion_tokens"] <= 4
        process.send_signal(sig)
        assert process.wait(60) == 0, process.stderr.read()
        assert "minillm server stopped" in process.stdout.read()
    finally:
        process.kill()
    with pytest.raises(ConnectionRefusedError):  # the port is free: nothing listens on it
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_serve_takes_vllms_engine_flags():
    from minillm.entrypoints.openai.api_server import engine_options, parse_args

    args = parse_args(["--max-num-seqs", "8", "--max-model-len", "256", "--kv-cache-memory-bytes", "1048576"])
    compiled = dict(enforce_eager=False, cudagraph_capture_sizes=[1])  # the batch-1 step compiled, by default
    assert engine_options(args) == dict(max_num_seqs=8, max_model_len=256, kvcache_memory_bytes=1048576) | compiled
    args = parse_args(["--block-size", "32", "--long-prefill-token-threshold", "64", "--scheduling-policy", "priority"])
    tuning = dict(kvcache_block_size=32, long_prefill_token_threshold=64, scheduling_policy="priority")
    assert engine_options(args) == tuning | compiled
    args = parse_args(["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"])
    assert engine_options(args) == dict(tensor_parallel_size=2, pipeline_parallel_size=2)  # eager: ranks can't compile
    assert engine_options(parse_args([])) == compiled and engine_options(parse_args(["--enforce-eager"])) == {}


def test_serve_takes_an_api_key_from_its_flag_or_the_environment_and_a_body_limit(monkeypatch):
    from minillm.entrypoints.openai.api_server import parse_args

    monkeypatch.delenv("MINILLM_API_KEY", raising=False)
    assert (parse_args([]).api_key, parse_args([]).max_request_body_bytes) == (None, 1 << 20)
    assert parse_args(["--api-key", "k", "--max-request-body-bytes", "10"]).max_request_body_bytes == 10
    monkeypatch.setenv("MINILLM_API_KEY", "from-env")
    assert parse_args([]).api_key == "from-env" and parse_args(["--api-key", "flag"]).api_key == "flag"
    with pytest.raises(SystemExit):
        parse_args(["--max-request-body-bytes", "0"])


def test_a_speculating_server_streams_several_tokens_a_step_and_counts_its_drafts(llm, reference):
    """The model as its own draft keeps every draft: each step gives up to k + 1 tokens, which must still arrive
    as the same text, token ids and usage, and show in vLLM's spec_decode counters."""
    spec = {"method": "draft_model", "model": str(default_model_path()), "num_speculative_tokens": 3}
    server = Server(AsyncLLM(LLM(llm.model_path, num_kvcache_blocks=BLOCKS, speculative_config=spec)), "story")
    try:
        body = dict(model="story", prompt=PROMPT, max_tokens=24, temperature=0, stream=True, return_token_ids=True)
        body["stream_options"] = {"include_usage": True}
        events = [line[6:] for line in post(server, "/v1/completions", body).text.splitlines() if line[6:]]
        chunks = [json.loads(e) for e in events[:-1]]
        ref = reference[0]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == ref.text
        assert [t for c in chunks if c["choices"] for t in c["choices"][0]["token_ids"]] == ref.token_ids
        assert max(len(c["choices"][0]["token_ids"]) for c in chunks if c["choices"]) > 1, "steps of several tokens"
        assert chunks[-1]["usage"]["completion_tokens"] == len(ref.token_ids)
        m = metrics(server)
        drafts = m["vllm:spec_decode_num_draft_tokens_total"]
        assert drafts > 0 and m["vllm:spec_decode_num_accepted_tokens_total"] == drafts
        assert m["vllm:generation_tokens_total"] == len(ref.token_ids)
    finally:
        server.stop()
