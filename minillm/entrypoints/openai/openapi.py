"""/openapi.json, made to say what the server does; schemathesis (tests/test_openapi.py) holds the server to it."""

from fastapi import FastAPI

from minillm.entrypoints.openai.middleware import is_public

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def openapi_schema(app: FastAPI, with_api_key: bool) -> dict:
    """FastAPI's schema of the app, less what this server does not do (a 422: it answers 400, documented per
    route), with integer bounds as integers, and with an API key, the bearer scheme of every non-public route."""
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
        if with_api_key:
            components["securitySchemes"] = {"APIKey": {"type": "http", "scheme": "bearer"}}
    return app.openapi_schema


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
