"""The rules /openapi.json states in words only, taught to schemathesis (tests/test_openapi.py). The first: a
request's prompt tokens plus its max_tokens fit the model's context. JSON Schema cannot relate two fields, and a
prompt's length in tokens is known only once it is tokenized, so a generated request that the schema allows but
that breaks the rule is skipped, not sent: the server's own /tokenize counts its tokens. Chapter 16's (each checked
here on its own, not by the server's code): min_tokens at most max_tokens; a tool_choice that calls a tool names
one of the tools, and tools without a tool_choice mean "auto", which needs a tool parser; one constraint on the
output at most; and a constraint that compiles (the grammar engine's own check). Loaded with
SCHEMATHESIS_HOOKS=schemathesis_hooks; the server's URL and default max_tokens come in MINILLM_URL and
MINILLM_DEFAULT_MAX_TOKENS."""

import os
from functools import cache

import httpx
import schemathesis

GENERATING = ("/v1/completions", "/v1/chat/completions")


@cache
def max_model_len() -> int:
    return httpx.get(os.environ["MINILLM_URL"] + "/v1/models").json()["data"][0]["max_model_len"]


def prompt_tokens(body: dict) -> int:
    """The prompt's length in tokens, as the server counts it."""
    if isinstance(body.get("prompt"), list):
        return len(body["prompt"])
    question = {"prompt": body["prompt"]} if "prompt" in body else {"messages": body["messages"]}
    answer = httpx.post(os.environ["MINILLM_URL"] + "/tokenize", json=question, timeout=30)
    assert answer.status_code == 200, f"/tokenize refused a schema-valid prompt: {answer.text}"
    return answer.json()["count"]


@schemathesis.hook
def filter_case(ctx, case) -> bool:
    """Keep every case but a schema-valid request to generate whose prompt and max_tokens do not fit."""
    if case.meta is None or case.meta.generation.mode != schemathesis.GenerationMode.POSITIVE:
        return True
    if case.operation.path not in GENERATING:
        return True
    body = case.body
    given = [body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None]
    max_tokens = given[0] if given else int(os.environ["MINILLM_DEFAULT_MAX_TOKENS"])
    if (body.get("min_tokens") or 0) > max_tokens or not (tools_fit(body) and constraint_compiles(body)):
        return False
    return prompt_tokens(body) + max_tokens <= max_model_len()


def tools_fit(body: dict) -> bool:
    """tool_choice "none" (or none and no tools) calls nothing; any other needs tools; "auto" (the default with
    tools) is refused; a named function is among the tools; a call is not constrained by structured_outputs too."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is None and tools:
        choice = "auto"
    if choice in (None, "none"):
        return True
    names = [tool["function"]["name"] for tool in tools or []]
    if not names or choice == "auto" or body.get("structured_outputs") is not None:
        return False
    return choice == "required" or choice["function"]["name"] in names


def constraint_compiles(body: dict) -> bool:
    """At most one of response_format (but "text") and structured_outputs, and what it gives (a tool's parameters
    too) compiles."""
    from minillm.sampling_params import StructuredOutputsParams
    from minillm.structured_output import validate_structured_outputs

    response_format, structured = body.get("response_format"), body.get("structured_outputs")
    specs = [] if structured is None else [{k: v for k, v in structured.items() if v is not None}]
    if response_format is not None and response_format["type"] != "text":
        if structured is not None:
            return False
        schema = response_format.get("json_schema", {}).get("schema", {"type": "object"})
        specs = [{"json": schema}]
    if body.get("tool_choice") not in (None, "none"):
        specs = [{"json": tool["function"].get("parameters") or {"type": "object"}} for tool in body["tools"]]
    try:
        for spec in specs:
            validate_structured_outputs(StructuredOutputsParams(**spec))
    except ValueError:
        return False
    return True
