"""Chapter 16's sampling API through the OpenAI-compatible server, driven by the official openai client and httpx:
n answers (whole and streamed, each chunk with its choice's index, usage over all), logprobs in OpenAI's two formats
(equal to LLM.generate's, greedy's chosen token the likeliest), structured outputs (response_format's JSON schemas
validated with jsonschema, json_object, vLLM's regex and choice), named function calling (tool_calls whose
arguments validate against the function's schema), logit_bias, vLLM's bench payload, and every refusal a 400 in
OpenAI's shape naming the field."""

import asyncio
import json
import re
import shutil
from dataclasses import dataclass

import httpx
import jsonschema
import openai
import pytest
from test_server import TEMPLATE, Server, post  # tests/ is on sys.path
from test_structured_output import SCHEMAS as TWENTY_SCHEMAS
from test_structured_outputs import bounded

from minillm import LLM, SamplingParams, default_model_path
from minillm.engine.async_llm import AsyncLLM
from minillm.entrypoints.openai.outputs import CompletionChunks, HeldStream, LogprobFormatter, hold_for
from minillm.logprobs import Logprob

PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me about a fox."}]
C, CHAT = "/v1/completions", "/v1/chat/completions"
BLOCKS = 256


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("story-chat") / "model"
    shutil.copytree(default_model_path(), path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return LLM(path, num_kvcache_blocks=BLOCKS)


@pytest.fixture(scope="module")
def server(llm):
    server = Server(AsyncLLM(llm, max_queue=64), "story")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def events(response: httpx.Response) -> list[dict]:
    """A streamed answer's chunks (the JSON of each `data:` event but [DONE])."""
    assert response.status_code == 200, response.text
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# ---- n answers ------------------------------------------------------------------------------------------------


def test_n_3_gives_3_choices_identical_when_greedy_and_usage_counts_them_all(client, llm):
    ref = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    out = client.completions.create(model="story", prompt=PROMPT, max_tokens=16, temperature=0, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [ref.text] * 3
    assert out.usage.completion_tokens == 3 * len(ref.token_ids)
    assert out.usage.prompt_tokens == len(ref.prompt_token_ids)

    chat = client.chat.completions.create(model="story", messages=MESSAGES, max_tokens=12, temperature=0, n=3)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert len({c.message.content for c in chat.choices}) == 1 and chat.choices[0].message.content


def test_sampled_choices_differ_and_a_seed_repeats_them(server):
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "n": 4, "seed": 7}
    texts = [c["text"] for c in post(server, C, body).json()["choices"]]
    assert len(texts) == 4 and len(set(texts)) > 1
    assert [c["text"] for c in post(server, C, body).json()["choices"]] == texts


def test_streamed_n_choices_carry_their_index_and_add_up_to_the_whole(server):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "n": 3, "ignore_eos": True}
    whole = post(server, C, body).json()
    chunks = events(post(server, C, body | {"stream": True, "stream_options": {"include_usage": True}}))
    texts, finished = ["", "", ""], []
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finished.append(choice["index"])
    assert texts == [c["text"] for c in whole["choices"]] and sorted(finished) == [0, 1, 2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 36

    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "n": 2, "stream": True}
    chunks = events(post(server, CHAT, body))
    first = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        first.setdefault(choice["index"], choice["delta"])
    assert sorted(first) == [0, 1] and all(d["role"] == "assistant" for d in first.values())


# ---- logprobs -------------------------------------------------------------------------------------------------


def test_completion_logprobs_are_llm_generates_and_greedys_token_is_the_likeliest(server, llm):
    ref = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=10, logprobs=3), use_tqdm=False)[0]
    choice = post(server, C, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 3}).json()
    choice = choice["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ref.token_ids)
    assert "".join(lp["tokens"]) == choice["text"] == ref.text
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    expected = [step[token].logprob for token, step in zip(ref.token_ids, ref.logprobs)]
    assert lp["token_logprobs"] == pytest.approx(expected, abs=1e-6)
    for token, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert 1 <= len(top) <= 4 and top[token] == chosen  # the 3 likeliest and the chosen one
        assert chosen == max(top.values()) and all(v <= 0 for v in top.values())

    # streamed: the same logprobs, spread over the chunks, the offsets running on
    streamed = events(
        post(server, C, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 3, "stream": True})
    )
    pieces = [c["choices"][0]["logprobs"] for c in streamed]
    assert sum((p["tokens"] for p in pieces), []) == lp["tokens"]
    assert sum((p["token_logprobs"] for p in pieces), []) == pytest.approx(lp["token_logprobs"])
    assert sum((p["text_offset"] for p in pieces), []) == lp["text_offset"]


def test_logprobs_0_lists_the_chosen_token_only(server):
    lp = post(server, C, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 0}).json()
    lp = lp["choices"][0]["logprobs"]
    assert all(list(top) == [token] for token, top in zip(lp["tokens"], lp["top_logprobs"]))


def test_chat_logprobs_and_top_logprobs(client, llm):
    out = client.chat.completions.create(
        model="story", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = out.choices[0]
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content and len(content) == out.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)  # greedy: the likeliest
        assert bytes(t.bytes).decode() == t.token
    # logprobs alone: the chosen tokens', no alternatives; none asked: none given
    bare = client.chat.completions.create(model="story", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True)
    assert [t.logprob for t in bare.choices[0].logprobs.content] == [t.logprob for t in content]
    assert all(t.top_logprobs == [] for t in bare.choices[0].logprobs.content)
    plain = client.chat.completions.create(model="story", messages=MESSAGES, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None

    stream = client.chat.completions.create(
        model="story", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = [t for chunk in stream for t in (chunk.choices[0].logprobs.content if chunk.choices[0].logprobs else [])]
    assert [t.token for t in streamed] == [t.token for t in content]


# ---- structured outputs ---------------------------------------------------------------------------------------

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "pet": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["cat", "dog", "fox"]},
                    "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                },
                "required": ["kind", "legs"],
                "additionalProperties": False,
            }
        },
        "required": ["pet"],
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 10},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        },
        "required": ["year"],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_response_format_json_schema_outputs_validate(client, server, name):
    schema = SCHEMAS[name]
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    for temperature in (0, 1.0):
        out = client.chat.completions.create(
            model="story", messages=MESSAGES, max_tokens=200, temperature=temperature, seed=1, n=2,
            response_format=response_format,
        )  # fmt: skip
        for choice in out.choices:
            assert choice.finish_reason == "stop", choice.message.content
            jsonschema.validate(json.loads(choice.message.content), schema)
    # the completions endpoint takes it too (as vLLM's)
    text = post(server, C, {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "response_format": response_format})
    jsonschema.validate(json.loads(text.json()["choices"][0]["text"]), schema)


def test_twenty_schemas_through_the_openai_client_validate(client):
    """tests/test_structured_outputs.py's twenty schemas (with its limits), greedy and sampled, as response_format."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(args):
        i, temperature = args
        schema = bounded(TWENTY_SCHEMAS[i])
        out = client.chat.completions.create(
            model="story", messages=MESSAGES, max_tokens=256, temperature=temperature, seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}},
        )  # fmt: skip
        return schema, out.choices[0]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, [(i, t) for t in (0, 1.0) for i in range(len(TWENTY_SCHEMAS))]))
    assert len(answers) == 40
    for schema, choice in answers:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_parses(client):
    """Any JSON object: the story model writes long strings into it, so some answers run out of tokens; those that
    end, end as a JSON object."""
    out = client.chat.completions.create(
        model="story", messages=MESSAGES, max_tokens=300, temperature=1.0, seed=3, n=4,
        response_format={"type": "json_object"},
    )  # fmt: skip
    ended = [c.message.content for c in out.choices if c.finish_reason == "stop"]
    assert ended and all(isinstance(json.loads(text), dict) for text in ended)
    assert all(c.message.content.startswith("{") for c in out.choices)
    text = client.chat.completions.create(
        model="story", messages=MESSAGES, max_tokens=8, temperature=0, response_format={"type": "text"}
    )
    assert text.choices[0].message.content  # text: no constraint


def test_structured_outputs_regex_and_choice_match(client, server):
    out = client.completions.create(
        model="story",
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        extra_body={"structured_outputs": {"regex": r"[A-Z][a-z]{2,8} (cat|dog)\."}},
    )
    assert re.fullmatch(r"[A-Z][a-z]{2,8} (cat|dog)\.", out.choices[0].text), out.choices[0].text
    choices = ["happy", "sad", "angry"]
    for temperature in (0, 1.0):
        out = client.chat.completions.create(
            model="story", messages=MESSAGES, max_tokens=10, temperature=temperature, n=3,
            extra_body={"structured_outputs": {"choice": choices}},
        )  # fmt: skip
        assert all(c.message.content in choices for c in out.choices)
    grammar = 'root ::= "The " animal " ran."\nanimal ::= "fox" | "owl"'
    text = post(server, C, {"prompt": PROMPT, "max_tokens": 10, "structured_outputs": {"grammar": grammar}})
    assert text.json()["choices"][0]["text"] in ("The fox ran.", "The owl ran.")
    jsonish = post(
        server,
        C,
        {"prompt": PROMPT, "max_tokens": 100, "temperature": 0, "structured_outputs": {"json": SCHEMAS["enum"]}},
    )
    jsonschema.validate(json.loads(jsonish.json()["choices"][0]["text"]), SCHEMAS["enum"])


# ---- function calling -----------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: an object


def test_a_named_tool_call_returns_tool_calls_whose_arguments_validate(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(
        model="story", messages=MESSAGES, max_tokens=100, temperature=0, tools=[TIME, WEATHER], tool_choice=choice, n=2
    )
    for c in out.choices:
        (call,) = c.message.tool_calls
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-") and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        assert not c.message.content and c.finish_reason == "stop"  # named: "stop", as vLLM and OpenAI
    assert out.choices[0].message.tool_calls[0].id != out.choices[1].message.tool_calls[0].id

    # streamed: the first delta names the call, the others add to its arguments
    stream = client.chat.completions.create(
        model="story",
        messages=MESSAGES,
        max_tokens=100,
        temperature=0,
        tools=[WEATHER],
        tool_choice=choice,
        stream=True,
    )
    calls = [call for chunk in stream for call in chunk.choices[0].delta.tool_calls or []]
    assert calls[0].id.startswith("chatcmpl-tool-") and calls[0].function.name == "get_weather"
    assert all(c.id is None and c.function.name is None and c.index == 0 for c in calls[1:])
    assert "".join(c.function.arguments for c in calls) == out.choices[0].message.tool_calls[0].function.arguments

    # a function without parameters: an empty object's worth of arguments
    out = client.chat.completions.create(
        model="story", messages=MESSAGES, max_tokens=100, temperature=0, tools=[TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    assert isinstance(json.loads(out.choices[0].message.tool_calls[0].function.arguments), dict)


def test_tool_choice_required_calls_the_tools_and_none_ignores_them(client):
    """ "required": a JSON array of calls, parsed into tool_calls (finish_reason "tool_calls"); the story model
    would call and call again, so parallel_tool_calls false keeps it to one. Streamed, the calls come whole."""
    body = dict(model="story", messages=MESSAGES, max_tokens=200, temperature=0, tools=[TIME, WEATHER])
    out = client.chat.completions.create(**body, tool_choice="required", parallel_tool_calls=False)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    for call in choice.message.tool_calls:
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"].get("parameters", {"type": "object"}))
    stream = client.chat.completions.create(**body, tool_choice="required", parallel_tool_calls=False, stream=True)
    (chunk,) = [c for c in stream if c.choices]
    assert chunk.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in chunk.choices[0].delta.tool_calls] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ]
    none = client.chat.completions.create(
        model="story", messages=MESSAGES, max_tokens=8, temperature=0, tools=[WEATHER], tool_choice="none"
    )
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content


# ---- logit_bias, penalties, and vLLM's bench ------------------------------------------------------------------


def test_logit_bias_forces_and_bans_tokens_and_neutral_penalties_change_nothing(server, llm):
    ref = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    forced = post(server, C, body | {"logit_bias": {"300": 100}}).json()["choices"][0]
    assert forced["token_ids"] == [300] * 8
    banned = post(server, C, body | {"logit_bias": {str(ref.token_ids[0]): -100}}).json()["choices"][0]
    assert banned["token_ids"][0] != ref.token_ids[0]
    neutral = {"repetition_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0, "min_p": 0, "min_tokens": 0}
    assert post(server, C, body | neutral).json()["choices"][0]["token_ids"] == ref.token_ids
    words = post(server, C, body | {"bad_words": ["there"]}).json()["choices"][0]["text"]
    assert "there" in ref.text and "there" not in words


def test_vllms_bench_payload_is_served(server):
    """What `vllm bench serve --backend openai` sends with every request (chapter 16's fix: each of these was a 400)."""
    body = {"model": "story", "prompt": PROMPT, "repetition_penalty": 1.0, "max_tokens": 6, "logprobs": None}
    body |= {"stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    chunks = events(post(server, C, body))
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    chat = {"model": "story", "messages": MESSAGES, "max_completion_tokens": 6, "stream": True, "ignore_eos": True}
    chunks = events(post(server, CHAT, chat | {"stream_options": {"include_usage": True}}))
    assert chunks[-1]["usage"]["completion_tokens"] == 6


# ---- refusals -------------------------------------------------------------------------------------------------

TOOLS = [WEATHER]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}
BAD_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
NOPE = {"type": "function", "function": {"name": "nope"}}


@pytest.mark.parametrize(
    "path, body, param, message",
    [
        (C, {"prompt": PROMPT, "n": 0}, "n", "greater than or equal to 1, got 0"),
        (C, {"prompt": PROMPT, "n": 1000}, "n", "less than or equal to 128, got 1000"),
        (C, {"prompt": PROMPT, "n": 2.5}, "n", "valid integer"),
        (C, {"prompt": PROMPT, "logprobs": 21}, "logprobs", "less than or equal to 20"),
        (C, {"prompt": PROMPT, "logprobs": -1}, "logprobs", "greater than or equal to 0"),
        (C, {"prompt": PROMPT, "logprobs": True}, "logprobs", "valid integer"),
        (C, {"prompt": PROMPT, "prompt_logprobs": 21}, "prompt_logprobs", "less than or equal to 20"),
        (CHAT, {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs: true"),
        (CHAT, {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        (CHAT, {"messages": MESSAGES, "logprobs": 2}, "logprobs", "valid boolean"),
        (C, {"prompt": PROMPT, "logit_bias": {"5": 500}}, "logit_bias", "less than or equal to 100"),
        (C, {"prompt": PROMPT, "logit_bias": {"99999": 1}}, "logit_bias", "unknown token ids [99999]"),
        (C, {"prompt": PROMPT, "logit_bias": {"abc": 1}}, "logit_bias", "String should match pattern"),
        (C, {"prompt": PROMPT, "logit_bias": {"5": "1"}}, "logit_bias", "valid number"),
        (C, {"prompt": PROMPT, "min_p": 1.5}, "min_p", "less than or equal to 1"),
        (C, {"prompt": PROMPT, "presence_penalty": 3}, "presence_penalty", "less than or equal to 2"),
        (C, {"prompt": PROMPT, "frequency_penalty": -2.5}, "frequency_penalty", "greater than or equal to -2"),
        (C, {"prompt": PROMPT, "repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        (C, {"prompt": PROMPT, "min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
        (C, {"prompt": PROMPT, "max_tokens": 4, "min_tokens": 8}, "min_tokens", "min_tokens must be"),
        (C, {"prompt": PROMPT, "bad_words": [" "]}, "bad_words", "should match pattern"),
        (C, {"prompt": PROMPT, "structured_outputs": {}}, "structured_outputs", "exactly one of"),
        (C, {"prompt": PROMPT, "structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "got ['regex', 'choice']"),
        (C, {"prompt": PROMPT, "structured_outputs": {"choice": []}}, "structured_outputs", "at least 1 item"),
        (C, {"prompt": PROMPT, "structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", "regex"),
        (C, {"prompt": PROMPT, "structured_outputs": {"grammar": "root ::= "}}, "structured_outputs", "grammar"),
        (C, {"prompt": PROMPT, "structured_outputs": {"json": "{not json"}}, "structured_outputs", "not valid JSON"),
        (C, {"prompt": PROMPT, "structured_outputs": {"guided_json": {}}}, "structured_outputs", "Extra inputs"),
        (CHAT, {"messages": MESSAGES, "response_format": BAD_SCHEMA}, "response_format", "response_format.json_schema.schema"),
        (CHAT, {"messages": MESSAGES, "response_format": {"type": "json_schema"}}, "response_format", "json_schema: Field required"),
        (CHAT, {"messages": MESSAGES, "response_format": {"type": "yaml"}}, "response_format", "does not match any of the expected tags"),
        (CHAT, {"messages": MESSAGES, "response_format": JSON_SCHEMA, "structured_outputs": {"regex": "a"}}, "response_format", "not both"),
        (CHAT, {"messages": MESSAGES, "tools": TOOLS, "tool_choice": NOPE}, "tool_choice", "'nope', which is not among tools"),
        (CHAT, {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"}, "tool_choice", "needs a tool parser"),
        (CHAT, {"messages": MESSAGES, "tools": TOOLS}, "tool_choice", '"auto" tool choice (the default when tools are given)'),
        (CHAT, {"messages": MESSAGES, "tool_choice": NAMED}, "tool_choice", "tool_choice needs tools"),
        (CHAT, {"messages": MESSAGES, "tools": []}, "tools", "at least 1 item"),
        (CHAT, {"messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED, "structured_outputs": {"regex": "a"}}, "tool_choice", "both"),
        (CHAT, {"messages": MESSAGES, "tools": [BAD_TOOL], "tool_choice": "required"}, "tools", "parameters schema"),
    ],
)  # fmt: skip
def test_bad_requests_answer_400_naming_the_field(server, path, body, param, message):
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["type"], error["code"]) == (param, "BadRequestError", 400), error
    assert message in error["message"], error["message"]


def test_the_openai_client_gets_its_bad_request_error(client):
    with pytest.raises(openai.BadRequestError, match="get_weather"):
        client.chat.completions.create(
            model="story",
            messages=MESSAGES,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "x"}},
        )


# ---- prompt logprobs (vLLM's) ---------------------------------------------------------------------------------


def engine_serves_prompt_logprobs(server) -> bool:
    response = post(server, C, {"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0})
    return response.status_code == 200


def test_prompt_logprobs_whole_streamed_and_echoed(server, llm):
    if not engine_serves_prompt_logprobs(server):
        pytest.skip("the engine does not compute prompt_logprobs yet")
    prompt_ids = llm.tokenizer.encode(PROMPT)
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 2}
    (choice,) = post(server, C, body).json()["choices"]
    steps = choice["prompt_logprobs"]
    assert len(steps) == len(prompt_ids) and steps[0] is None
    for token, step in zip(prompt_ids[1:], steps[1:]):
        assert str(token) in step and 1 <= len(step) <= 3
        assert all(v["logprob"] <= 0 and v["rank"] >= 1 and isinstance(v["decoded_token"], str) for v in step.values())
    streamed = events(post(server, C, body | {"stream": True}))
    assert streamed[0]["choices"][0]["prompt_logprobs"] == steps
    chat = post(server, CHAT, {"messages": MESSAGES, "max_tokens": 2, "prompt_logprobs": 1}).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]

    # echo with logprobs: the prompt's tokens first (the first without a logprob), then the completion's
    echo = post(server, C, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 1, "echo": True}).json()
    lp = echo["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(prompt_ids) + 4 and lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx(
        [steps[i][str(t)]["logprob"] for i, t in enumerate(prompt_ids) if i] + lp["token_logprobs"][len(prompt_ids) :]
    )


@dataclass
class Out:
    """A DeltaOutput with the fields the engine's front end adds (chapter 16)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    index: int = 0
    logprobs: list | None = None
    prompt_logprobs: list | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class FakeStream:
    def __init__(self, outputs):
        self.outputs, self.prompt_token_ids, self.aborted = iter(outputs), [1, 5, 9], False

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return next(self.outputs)
        except StopIteration:
            raise StopAsyncIteration from None

    def abort(self):
        self.aborted = True


def step(token: int, logprob: float, *others: tuple[int, float]) -> dict:
    return {token: Logprob(logprob, 1, f"<{token}>"), **{t: Logprob(lp, 2, f"<{t}>") for t, lp in others}}


def test_held_back_outputs_keep_their_logprobs_and_the_prompts_go_first(llm):
    """What sse_events would skip (an output without text: its token's logprobs with it) is merged into its answer's
    next output; the prompt's logprobs, on an output held back, go out on the first one sent, whatever its answer."""
    prompt = [None, step(5, -1.0), step(9, -2.0)]
    outputs = [
        Out("", [11], index=0, logprobs=[step(11, -0.5)], prompt_logprobs=prompt),  # an unfinished character
        Out("b", [21], index=1, logprobs=[step(21, -0.25)]),
        Out("a", [12], index=0, logprobs=[step(12, -0.75)], finish_reason="length"),
        Out("c", [22], index=1, logprobs=[step(22, -0.1)], finish_reason="length"),
    ]

    async def run():
        stream = HeldStream(FakeStream(outputs), hold_for(True, None))
        return [out async for out in stream]

    got = asyncio.run(run())
    assert [(o.index, o.text, o.token_ids) for o in got] == [(1, "b", [21]), (0, "a", [11, 12]), (1, "c", [22])]
    assert got[0].prompt_logprobs == prompt and [list(s) for s in got[1].logprobs] == [[11], [12]]

    # as a streamed completion's chunks, echo and logprobs: each answer's first chunk after the prompt's tokens
    chunks = CompletionChunks("cmpl-1", "m", "Hi", [1, 5, 9], LogprobFormatter(llm.tokenizer), 1, True, True)
    first, second = chunks(got[0], None, True).choices[0], chunks(got[1], None, False).choices[0]
    assert (first.index, first.text, second.index, second.text) == (1, "Hib", 0, "Hia")
    assert first.logprobs.tokens == [llm.tokenizer.decode([1], False), "<5>", "<9>", "<21>"]
    assert first.logprobs.token_logprobs == [None, -1.0, -2.0, -0.25]
    assert first.logprobs.text_offset == [0, len(first.logprobs.tokens[0]), len(first.logprobs.tokens[0]) + 3,
                                          len(first.logprobs.tokens[0]) + 6]  # fmt: skip
    assert second.logprobs.token_logprobs == [None, -1.0, -2.0, -0.5, -0.75]  # its prompt echoed too
    assert first.prompt_logprobs[1][5].logprob == -1.0 and second.prompt_logprobs == first.prompt_logprobs
    third = chunks(got[2], None, False).choices[0]
    assert third.text == "c" and third.logprobs.text_offset == [first.logprobs.text_offset[-1] + 4]
    assert third.prompt_logprobs is None
