"""The one rule /openapi.json states in words only, taught to schemathesis (tests/test_openapi.py): a request's
prompt tokens plus its max_tokens fit the model's context. JSON Schema cannot relate two fields, and a prompt's
length in tokens is known only once it is tokenized, so a generated request that the schema allows but that
breaks the rule is skipped, not sent: the server's own /tokenize counts its tokens. Loaded with
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
    return prompt_tokens(body) + max_tokens <= max_model_len()
