"""/openapi.json, made to say what the server does; schemathesis (tests/test_openapi.py) holds the server to it."""

from fastapi import FastAPI

from minillm.entrypoints.openai.middleware import is_public
from minillm.entrypoints.openai.serving import ModelLimits

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def openapi_schema(app: FastAPI, with_api_key: bool, limits: ModelLimits) -> dict:
    """FastAPI's schema of the app, less what this server does not do (a 422: it answers 400, documented per
    route), with integer bounds as integers, the served model's bounds, and with an API key, the bearer scheme of
    every non-public route."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)  # builds and caches app.openapi_schema
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                operation["responses"].pop("422", None)
                if with_api_key and not is_public(path):
                    operation["security"] = [{"APIKey": []}]
        components = schema.setdefault("components", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components["schemas"].pop(name, None)
        integer_bounds(components["schemas"])
        model_bounds(components["schemas"], limits)
        if with_api_key:
            components["securitySchemes"] = {"APIKey": {"type": "http", "scheme": "bearer"}}
    return app.openapi_schema


def model_bounds(schemas: dict, limits: ModelLimits) -> None:
    """Publish the bounds that depend on the model, which the request models cannot know: a prompt's token ids,
    /detokenize's and logit_bias' below the vocabulary size, top_k at most that size, a prompt's characters
    (/tokenize's too) and tokens and max_tokens (min_tokens too) within the context. Some rules are left to the
    fields' descriptions, as JSON Schema cannot state them: the prompt's tokens plus max_tokens fit max_model_len,
    min_tokens is at most max_tokens, a tool_choice names one of the tools, and a constraint on the output (a JSON
    schema, a regex, a grammar) compiles."""
    vocab_size, max_model_len, max_prompt_chars = limits
    completion, chat = schemas["CompletionRequest"]["properties"], schemas["ChatCompletionRequest"]["properties"]
    text, token_ids = completion["prompt"]["anyOf"]
    for text in (text, schemas["TokenizeRequest"]["properties"]["prompt"]["anyOf"][0]):
        text["maxLength"] = max_prompt_chars
    token_ids["maxItems"] = max_model_len - 1  # one token of the context is left to generate
    for tokens in (token_ids, schemas["DetokenizeRequest"]["properties"]["tokens"]):
        tokens["items"]["maximum"] = vocab_size - 1
    for fields in (completion, chat):
        fields["top_k"]["anyOf"][0]["maximum"] = vocab_size
        fields["logit_bias"]["anyOf"][0]["propertyNames"]["pattern"] = numbers_below(vocab_size)
        fields["min_tokens"]["maximum"] = max_model_len - 1
        for name in ("max_tokens", "max_completion_tokens"):
            if name in fields:
                fields[name]["anyOf"][0]["maximum"] = max_model_len - 1
                fit = f"the prompt's tokens plus these fit the model's context ({max_model_len} tokens)"
                fields[name]["description"] = "; ".join(filter(None, (fields[name].get("description"), fit)))


def integer_bounds(node) -> None:
    """Give an integer's bounds back as integers: FastAPI's OpenAPI model writes every bound as a float, and a
    float holds integers exactly up to 2**53 only (a seed's bound of 2**63 stays exact: a power of two)."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            node.update({key: int(node[key]) for key in BOUNDS if isinstance(node.get(key), float)})
        for value in node.values():
            integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            integer_bounds(value)


def numbers_below(n: int) -> str:
    """A regular expression of the decimal numbers in [0, n) without leading zeros (n >= 1): JSON Schema bounds a
    number, and logit_bias' token ids are an object's keys, strings."""
    top = str(n - 1)
    alternatives = ["0"] + [f"[1-9][0-9]{{{k}}}" if k else "[1-9]" for k in range(len(top) - 1)]
    for i, digit in enumerate(top):  # as long as top: agree with it up to digit i, then be below it there
        low, high = 1 if i == 0 else 0, int(digit) - 1
        if high >= low:
            rest = len(top) - i - 1
            alternatives.append(top[:i] + f"[{low}-{high}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alternatives.append(top)
    return "^(" + "|".join(dict.fromkeys(alternatives)) + ")$"
