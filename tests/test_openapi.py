"""/openapi.json says what the server does, and schemathesis holds the server to it: from the schema it generates
requests, valid and invalid (its coverage and fuzzing phases), and checks every answer: no 5xx, a documented status
code and content type, a body (or server-sent event) that fits the documented schema, invalid requests refused,
the Allow header of a 405. Bounded examples and a fixed seed keep a run reproducible and under a minute.

Every check runs, positive_data_acceptance too (a request the schema allows must be served; vLLM's own schemathesis
test leaves it out): the schema publishes the served model's bounds (its vocabulary, its context), and the one rule
JSON Schema cannot state, a prompt's tokens plus max_tokens within the context, is taught to schemathesis by a hook
(tests/schemathesis_hooks.py) that skips schema-valid requests breaking it."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_server import TEMPLATE, Server  # tests/ is on sys.path

from minillm import LLM, default_model_path
from minillm.engine.async_llm import AsyncLLM
from minillm.entrypoints.openai.openapi import numbers_below

ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}
# route -> (method, the statuses it documents besides 200)
ROUTES = {
    "/v1/completions": ("post", {"400", "404", "413", "429", "500"}),
    "/v1/chat/completions": ("post", {"400", "404", "413", "429", "500"}),
    "/tokenize": ("post", {"400", "404", "413"}),
    "/detokenize": ("post", {"400", "404", "413"}),
    "/v1/models": ("get", set()),
    "/health": ("get", {"503"}),
    "/metrics": ("get", set()),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The story model with a chat template, so that chats are served too; max_model_len 128 keeps each
    generated answer short."""
    path = tmp_path_factory.mktemp("story-chat") / "model"
    shutil.copytree(default_model_path(), path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    server = Server(AsyncLLM(LLM(path, num_kvcache_blocks=64, max_model_len=128), max_queue=64), "story")
    yield server
    server.stop()


def test_each_route_documents_its_errors_content_types_and_bounds(server):
    schema = httpx.get(server.url + "/openapi.json").json()
    for path, (method, statuses) in ROUTES.items():
        responses = schema["paths"][path][method]["responses"]
        assert set(responses) == {"200"} | statuses, path  # no 422: a body it cannot validate gets 400
        assert all(responses[s]["content"]["application/json"]["schema"] == ERROR_SCHEMA for s in statuses)
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert set(schema["paths"][path]["post"]["responses"]["200"]["content"]) == {
            "application/json",
            "text/event-stream",
        }
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "content" not in schema["paths"]["/health"]["get"]["responses"]["200"]  # an empty 200, as vLLM's
    fields = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert fields["seed"]["anyOf"][0] == {
        "type": "integer",
        "format": "int64",
        "minimum": -(2**63),
        "exclusiveMaximum": 2**63,
    }
    assert fields["top_k"]["anyOf"][0] == {"type": "integer", "minimum": -1, "maximum": 1280}  # the vocabulary's size
    assert fields["top_p"]["anyOf"][0] == {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0}
    assert fields["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0.0}
    assert fields["max_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 127}  # max_model_len 128
    text, token_ids = fields["prompt"]["anyOf"]
    assert (text["minLength"], text["maxLength"]) == (1, 128 * server.async_llm.processor.max_chars_per_token)
    assert (token_ids["minItems"], token_ids["maxItems"], token_ids["items"]["maximum"]) == (1, 127, 1279)
    assert fields["stop"]["anyOf"][1]["maxItems"] == 64 and fields["stop_token_ids"]["anyOf"][0]["maxItems"] == 1024
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    # chapter 16: SamplingParams' bounds, logit_bias' token ids in the vocabulary (an object's keys: a pattern)
    assert fields["n"] | {"description": None} == {"type": "integer", "minimum": 1, "maximum": 128, "title": "N",
                                                   "default": 1, "description": None}  # fmt: skip
    assert fields["logprobs"]["anyOf"][0] == fields["prompt_logprobs"]["anyOf"][0]
    assert fields["logprobs"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 20}
    bias = fields["logit_bias"]["anyOf"][0]
    assert bias["propertyNames"]["pattern"] == numbers_below(1280) and re.fullmatch(numbers_below(1280), "1279")
    assert not re.fullmatch(numbers_below(1280), "1280") and not re.fullmatch(numbers_below(1280), "01")
    assert bias["additionalProperties"] == {"type": "number", "minimum": -100, "maximum": 100}
    assert fields["min_tokens"]["maximum"] == 127
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["then"] == {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}  # top_logprobs'
    kinds = schema["components"]["schemas"]["StructuredOutputs"]["oneOf"]
    assert [k["required"] for k in kinds] == [["json"], ["regex"], ["choice"], ["grammar"], ["json_object"]]


# schemathesis' statuses that refuse a request, and 413: a body over the limit is refused before it is validated
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
"""


def test_schemathesis_finds_no_failure(server, tmp_path):
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(tmp_path / "schemathesis.toml")]
    command += ["run", server.url + "/openapi.json", "--checks", "all"]
    command += ["--max-examples", "20", "--seed", "45"]
    command += ["--generation-database", "none", "--workers", "1", "--no-color", "--request-timeout", "30"]
    command += ["--report", "json", "--report-dir", str(tmp_path)]
    env = os.environ | {
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join(filter(None, (str(Path(__file__).parent), os.environ.get("PYTHONPATH")))),
        "MINILLM_URL": server.url,
        "MINILLM_DEFAULT_MAX_TOKENS": str(server.async_llm.processor.default_sampling_params().max_tokens),
    }
    # cwd: schemathesis writes a cache directory where it runs
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    report = json.loads(next(tmp_path.glob("json-*.json")).read_text())
    assert report["operations"]["tested"] == len(ROUTES) and report["test_cases"]["generated"] > 500
    assert report["test_cases"]["with_failures"] == report["test_cases"]["errored"] == 0
