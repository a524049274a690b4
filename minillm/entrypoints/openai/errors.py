"""The server's refusals, all in OpenAI's error shape (serving.APIError).

FastAPI and Starlette answer some refusals themselves, each in a shape of its own: pydantic's validation errors
(422, a list of details), no such route (404) or method (405), a body that cannot be read. The handlers here give
each OpenAI's shape and a message that names the field, the value and the fix; a bug is a 500 in the same shape.
"""

import reprlib

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from minillm.engine.async_llm import EngineError
from minillm.entrypoints.openai.serving import APIError


def add_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(EngineError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)


async def api_error(request: Request, exc: APIError | EngineError) -> Response:
    """An APIError as its answer; an EngineError (a failed step, a closed engine) as a 500."""
    return (exc if isinstance(exc, APIError) else APIError(500, str(exc))).response()


async def validation_error(request: Request, exc: RequestValidationError) -> Response:
    """pydantic's complaints about a request body as a 400 in OpenAI's format, `param` the first field at fault;
    each names the field, what it must be, and the value given (shortened)."""
    errors = exc.errors()
    if errors[0]["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {errors[0]['ctx']['error']}").response()
    if tuple(errors[0]["loc"]) == ("body",):  # no body, or not an object, or not sent as JSON
        message = "the body must be a JSON object, sent with the header Content-Type: application/json"
        return APIError(400, message + given(errors[0])).response()
    found = field_errors(errors)[:5]
    messages = [(f"{field}: " if field else "") + e["msg"] + given(e) for field, e in found]
    param = next((field.split(".")[0] for field, _ in found if field), None)
    return APIError(400, "; ".join(messages), param).response()


def given(error: dict) -> str:
    """The value given, shortened, to end the message with; none for a missing field (its "input" is the body)."""
    return "" if error["type"] == "missing" else f", got {reprlib.repr(error['input'])}"


def field_errors(errors: list[dict]) -> list[tuple[str, dict]]:
    """pydantic's errors as (the field's path, the error). A value checked against a union (str | list[int]) gets
    one error per member, each tagged in its location with the member's type ("constrained-str", "list[int]"):
    the tags are left out of the path, and a member's "not of my type" is left out where another member of the
    same field says more (an empty prompt is too short a string, not "no list")."""
    found = [(".".join(str(p) for p in e["loc"][1:] if not is_union_tag(p)), e) for e in errors]
    specific = {path.split(".")[0] for path, e in found if not e["type"].endswith("_type")}
    return [(path, e) for path, e in found if not (e["type"].endswith("_type") and path.split(".")[0] in specific)]


def is_union_tag(part) -> bool:
    """Whether a part of a pydantic error's location names a union member's type rather than a field or index."""
    return isinstance(part, str) and (not part.isidentifier() or part in ("str", "int", "float", "bool"))


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's refusals in OpenAI's format: no such route, a method the route does not take, a body that could
    not be read or is too large (RequestBodyLimitMiddleware)."""
    where = f"{request.method} {request.url.path}"
    message = {
        404: f"there is no route {where}: /openapi.json lists this server's routes",
        405: f"{where}: the route takes {(exc.headers or {}).get('Allow')} only",
    }.get(exc.status_code, exc.detail)
    return APIError(exc.status_code, message).response(exc.headers)


async def server_error(request: Request, exc: Exception) -> Response:
    """A bug: a 500 in OpenAI's format (Starlette logs the traceback after sending it)."""
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()
