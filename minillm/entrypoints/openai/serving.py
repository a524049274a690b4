"""What one OpenAI request becomes: SamplingParams, a request on AsyncLLM, and its answer, whole or streamed as
server-sent events (`data: {json}` and a blank line per chunk, then `data: [DONE]`)."""

import asyncio
import copy
import dataclasses
import functools
import re
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from minillm.engine.async_llm import AsyncLLM, EngineError, QueueFullError, RequestStream
from minillm.engine.output_processor import DeltaOutput
from minillm.entrypoints.openai.outputs import ToolMode
from minillm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, SamplingFields, UsageInfo
from minillm.sampling_params import SamplingParams, StructuredOutputsParams
from minillm.structured_output import validate_structured_outputs

# status -> (OpenAI's error type, what it means here: /openapi.json documents each route's with these)
ERRORS = {
    400: ("BadRequestError", "a field of the request is invalid: `param` names it"),
    401: ("AuthenticationError", "no API key, or a wrong one (the server runs with --api-key)"),
    404: ("NotFoundError", "no such model (`param`: model), or no such route"),
    405: ("MethodNotAllowedError", "the route does not take this HTTP method (the Allow header lists those it takes)"),
    413: ("RequestTooLargeError", "the request body is larger than --max-request-body-bytes"),
    429: ("RateLimitError", "max_queue requests are waiting for their first token: retry later"),
    500: ("InternalServerError", "the engine failed on this request (the server serves on)"),
    503: ("ServiceUnavailableError", "the engine is not serving"),
}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop_token_ids", "ignore_eos", "skip_special_tokens")
# chapter 16's, under the same names in the request and in SamplingParams
SAMPLING_FIELDS += ("n", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens")
SAMPLING_FIELDS += ("bad_words",)
NO_TOKEN_IDS = {"prompt_token_ids": True, "choices": {"__all__": {"token_ids"}}}


class APIError(Exception):
    """An answer other than 200, in OpenAI's error format; `param` names the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> str:
        error_type = ERRORS[self.status][0] if self.status in ERRORS else "APIStatusError"  # the openai client's
        info = ErrorInfo(message=str(self), type=error_type, param=self.param, code=self.status)
        return ErrorResponse(error=info).model_dump_json()

    def response(self, headers: dict[str, str] | None = None) -> Response:
        return Response(self.body(), self.status, headers, media_type="application/json")


def error_responses(*statuses: int) -> dict:
    """The `responses` of a route's OpenAPI entry for these statuses, each with OpenAI's error shape."""
    return {status: {"model": ErrorResponse, "description": ERRORS[status][1]} for status in statuses}


class ModelLimits(NamedTuple):
    """What the served model bounds: its vocabulary, its context (max_model_len tokens), and the characters that
    many tokens can spell at most."""

    vocab_size: int
    max_model_len: int
    max_prompt_chars: int


def to_sampling_params(request: SamplingFields, defaults: SamplingParams, limits: ModelLimits) -> SamplingParams:
    """The request's sampling fields over the model's defaults (LLM.get_default_sampling_params), checked by
    SamplingParams itself: a bad value answers 400 with its message, naming the field. The protocol has checked
    each field's bounds already; this adds those that depend on the model (as /openapi.json publishes them): top_k
    at most its vocabulary, max_tokens (either name, used or not) below its context, logit_bias' token ids in the
    vocabulary; and the rules that relate fields: top_logprobs needs logprobs, one constraint on the output
    (response_format, structured_outputs or a tool's schema), min_tokens at most max_tokens."""
    if request.top_k is not None and request.top_k > limits.vocab_size:
        message = f"top_k must be at most the vocabulary size ({limits.vocab_size}; 0 = no limit), got {request.top_k}"
        raise APIError(400, message, "top_k")
    for name in ("max_tokens", "max_completion_tokens"):
        if (value := getattr(request, name, None)) is not None and value >= limits.max_model_len:
            message = (
                f"{name} must be below max_model_len={limits.max_model_len} (the prompt needs a token), got {value}"
            )
            raise APIError(400, message, name)
    if request.logit_bias and (bad := [int(t) for t in request.logit_bias if int(t) >= limits.vocab_size]):
        message = f"logit_bias: unknown token ids {bad[:5]}: ids must be in [0, {limits.vocab_size})"
        raise APIError(400, message, "logit_bias")
    if getattr(request, "top_logprobs", None) and not request.logprobs:  # chat's
        message = f"top_logprobs needs logprobs: true, got top_logprobs={request.top_logprobs} and no logprobs"
        raise APIError(400, message, "top_logprobs")
    chosen = {name: getattr(request, name) for name in SAMPLING_FIELDS if getattr(request, name) is not None}
    given = getattr(request, "max_completion_tokens", None) is not None
    max_tokens_field = "max_completion_tokens" if given else "max_tokens"
    if getattr(request, max_tokens_field) is not None:
        chosen["max_tokens"] = getattr(request, max_tokens_field)
    if request.logit_bias:
        chosen["logit_bias"] = {int(token): bias for token, bias in request.logit_bias.items()}
    if request.num_logprobs is not None:
        chosen["logprobs"] = request.num_logprobs
    if request.num_prompt_logprobs is not None:
        chosen["prompt_logprobs"] = request.num_prompt_logprobs
    constraint_field, kwargs = output_constraint(request) or (None, None)
    if kwargs is not None:
        try:
            chosen["structured_outputs"] = StructuredOutputsParams(**kwargs)
        except ValueError as e:
            raise APIError(400, str(e), constraint_field) from None
    # SamplingParams' field -> the request's that set it
    logprobs_field = "top_logprobs" if "top_logprobs" in type(request).model_fields else "logprobs"
    fields = {"max_tokens": max_tokens_field, "logprobs": logprobs_field, "structured_outputs": constraint_field}
    try:
        return dataclasses.replace(defaults, **chosen)
    except ValueError as e:
        name = (match := re.match(r"\w+", str(e))) and match.group()
        raise APIError(400, str(e), fields.get(name, name) if name in chosen else None) from None


def output_constraint(request: SamplingFields) -> tuple[str, dict] | None:
    """(the request field, StructuredOutputsParams' keywords) of what the output must match, if anything: a named
    function's parameters or "required"'s calls (chat), else response_format or structured_outputs (one of them)."""
    try:
        constraint = request.structured()
    except ValueError as e:
        raise APIError(400, str(e), "response_format") from None
    tool = tool_mode(request)
    if tool is None:
        return constraint
    if constraint is not None and constraint[0] == "structured_outputs":  # vLLM's rule (response_format: replaced)
        raise APIError(400, "give structured_outputs or a tool_choice that calls a tool, not both", "tool_choice")
    return "tools", {"json": tool_schema(request, tool)}


def tool_mode(request) -> ToolMode | None:
    """How a chat request's answers become tool calls (vLLM's rules): none without tools or with tool_choice
    "none"; tools without a tool_choice mean "auto", which needs a tool parser (minillm has none: refused, as
    vLLM refuses it without --tool-call-parser); a named function must be among the tools."""
    choice, tools = getattr(request, "tool_choice", None), getattr(request, "tools", None)
    if choice is None and tools:
        choice = "auto"
    if choice is None or choice == "none":
        return None
    if not tools:
        raise APIError(400, "tool_choice needs tools: the functions it may call", "tool_choice")
    if choice == "auto":
        message = (
            '"auto" tool choice (the default when tools are given) needs a tool parser to find calls in free text, '
            'and minillm has none: name the function in tool_choice ({"type": "function", "function": {"name": '
            '...}}), or give "required" (one or more calls) or "none"'
        )
        raise APIError(400, message, "tool_choice")
    if choice == "required":
        return ToolMode(required=True)
    names = [tool.function.name for tool in tools]
    if choice.function.name not in names:
        message = f"tool_choice names the function {choice.function.name!r}, which is not among tools {names}"
        raise APIError(400, message, "tool_choice")
    return ToolMode(name=choice.function.name)


def parameters_schema(parameters: dict | None) -> dict:
    return {"type": "object", "properties": {}} if parameters is None else parameters


def tool_schema(request, tool: ToolMode) -> dict:
    """The JSON schema the answer is generated under (vLLM's): a named function's parameters; with "required",
    an array of one or more {"name", "parameters"} of the tools (one only if parallel_tool_calls is false), their
    $defs gathered at the top where a $ref finds them."""
    if tool.name is not None:
        return parameters_schema(next(t.function for t in request.tools if t.function.name == tool.name).parameters)
    calls, defs = [], {}
    for t in request.tools:
        parameters = copy.deepcopy(parameters_schema(t.function.parameters))
        for name, schema in (parameters.pop("$defs", None) or {}).items():
            if defs.setdefault(name, schema) != schema:
                raise APIError(400, f"tools define $defs {name!r} twice, differently", "tools")
        properties = {"name": {"type": "string", "enum": [t.function.name]}, "parameters": parameters}
        calls.append({"properties": properties, "required": ["name", "parameters"]})
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
    if request.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema | ({"$defs": defs} if defs else {})


def constraint_field(request: SamplingFields) -> str | None:
    """The request field that constrains the output (to_sampling_params has checked there is at most one)."""
    constraint = output_constraint(request)
    return None if constraint is None else constraint[0]


# where a constraint's spec sits in the request, by the field it comes from (validate_structured_outputs names it
# as StructuredOutputsParams' field)
SPEC_PLACES = {"response_format": "response_format.json_schema.schema", "tools": "the function's parameters schema"}


def check_structured_outputs(params: SamplingParams, param: str | None) -> None:
    """A constraint the grammar engine cannot compile answers 400 naming the request's field (the engine's front
    end would refuse it too, naming no field). A cheap check: no vocabulary is involved."""
    if params.structured_outputs is None:
        return
    try:
        validate_structured_outputs(params.structured_outputs)
    except ValueError as e:
        message = str(e)
        if param in SPEC_PLACES:
            message = re.sub(r"^structured_outputs\.json(_object)?", SPEC_PLACES[param], message)
        raise APIError(400, message, param) from None


def check_prompt_length(num_chars: int, max_chars: int, max_model_len: int, param: str) -> None:
    """Refuse, before any tokenizing, a prompt with more characters than max_model_len tokens can hold: no token
    spells more than max_chars / max_model_len characters, so such a prompt has more than max_model_len tokens."""
    if num_chars > max_chars:
        raise APIError(
            400,
            f"the prompt has {num_chars} characters, more than the {max_chars} that max_model_len={max_model_len} "
            f"tokens can spell (at most {max_chars // max_model_len} characters a token): shorten the prompt",
            param,
        )


def stop_strings(request: SamplingFields) -> list[str]:
    return [request.stop] if isinstance(request.stop, str) else request.stop or []


async def add_request(async_llm: AsyncLLM, prompt, params: SamplingParams, stop, param: str) -> RequestStream:
    """async_llm.add_request, its refusals as HTTP answers: a full queue 429, a bad prompt 400 naming `param` (or
    the sampling field the engine's message begins with: one it does not serve)."""
    try:
        return await async_llm.add_request(prompt, params, stop)
    except QueueFullError as e:
        raise APIError(429, str(e)) from None
    except ValueError as e:
        name = (match := re.match(r"\w+", str(e))) and match.group()
        sampling = name in SAMPLING_FIELDS or name in ("logprobs", "prompt_logprobs", "logit_bias", "bad_words")
        raise APIError(400, str(e), name if sampling else param) from None


def usage(stream: RequestStream, num_tokens: int) -> UsageInfo:
    prompt_tokens = len(stream.prompt_token_ids)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=num_tokens, total_tokens=prompt_tokens + num_tokens)


def to_json(response: BaseModel, with_token_ids: bool) -> str:
    return response.model_dump_json(exclude=None if with_token_ids else NO_TOKEN_IDS)


def streaming_response(
    stream: RequestStream,
    chunk: Callable[[DeltaOutput | None, UsageInfo | None, bool], BaseModel],
    request: SamplingFields,
) -> StreamingResponse:
    """The stream as server-sent events: chunk(out, None, first) per output that has text, token ids (when asked)
    or a finish reason, the first one with the prompt's token ids; chunk(None, usage, False) last if
    stream_options.include_usage. An engine failure part-way is sent as an error event (the 200 is gone)."""
    include_usage = request.stream_options is not None and request.stream_options.include_usage
    return StreamingResponse(
        sse_events(stream, chunk, request.return_token_ids, include_usage), media_type="text/event-stream"
    )


async def sse_events(stream, chunk, with_token_ids: bool, include_usage: bool) -> AsyncIterator[str]:
    """A request's outputs as server-sent events, the framing of OpenAI's streaming API: each event is one line
    `data: <json>` and a blank line (the string "data: " + json + "\n\n"), and the stream ends with the event
    `data: [DONE]`.

    `stream` is the request's RequestStream: iterating it (`async for out in stream`) gives DeltaOutputs, each with
    `out.text` (the new text, maybe ""), `out.token_ids` (the new token ids) and `out.finished`. Count every
    output's tokens (len(out.token_ids)). Send an event for each output that has text, or is the last one
    (out.finished), or for every output when `with_token_ids` is True: `response = chunk(out, None, first)`,
    where `first` is True for the first event only; on that first response also set `response.prompt_token_ids =
    stream.prompt_token_ids`; the event's json is `to_json(response, with_token_ids)`. After the last output, if
    `include_usage`, one more event: `to_json(chunk(None, usage(stream, num_tokens), False), with_token_ids)`.
    If the engine fails part-way (iterating raises EngineError), the HTTP status 200 has gone out already:
    send the error itself as an event, `APIError(500, str(e)).body()`, and no usage event after it; then end as
    usual. Whatever happens, call `stream.abort()` (in a `finally`: a client that went away closes this generator,
    and abort is what stops its generation and frees its KV blocks; on a finished request it does nothing). Send
    `data: [DONE]` after the try/finally, not inside the `finally`: a generator being closed must not yield.

    Example: outputs "Once" and " upon" (finished), include_usage True: four events, `data: {...}` from
    chunk(out1, None, True) with the prompt's token ids, `data: {...}` from chunk(out2, None, False), the usage
    event, and `data: [DONE]`.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 12.1: server-sent events — frame each output as a data event, usage last, errors in-band, [DONE]
    num_tokens, first = 0, True
    try:
        async for out in stream:
            num_tokens += len(out.token_ids)
            if out.text or out.finished or with_token_ids:
                response = chunk(out, None, first)
                if first:
                    response.prompt_token_ids, first = stream.prompt_token_ids, False
                yield f"data: {to_json(response, with_token_ids)}\n\n"
        if include_usage:
            yield f"data: {to_json(chunk(None, usage(stream, num_tokens), False), with_token_ids)}\n\n"
    except EngineError as e:
        yield f"data: {APIError(500, str(e)).body()}\n\n"
    finally:
        stream.abort()  # a client that went away: stop generating for it
    yield "data: [DONE]\n\n"
    # END EXERCISE


def with_cancellation(handler):
    """Run a route handler until it returns or its client disconnects, whichever comes first: cancelled, the
    handler's request is aborted (vLLM's decorator). The body must be read already (FastAPI parsed it); once a
    StreamingResponse is returned, Starlette watches for the disconnect itself."""

    @functools.wraps(handler)
    async def wrapper(request, raw_request: Request):
        work = asyncio.ensure_future(handler(request, raw_request))
        gone = asyncio.ensure_future(disconnected(raw_request))
        try:
            await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when this wrapper is cancelled (a server shutting down)
            gone.cancel()
            work.cancel()  # a task that is done already ignores it
            # cancel() only asks: wait until both have stopped, so that the handler's cleanup (its request aborted)
            # has run and work is settled (result() on a task still being cancelled raises InvalidStateError)
            await asyncio.wait([work, gone])
        if work.cancelled():
            return Response(status_code=499)  # nginx's "client closed request": nobody reads it
        return work.result()

    return wrapper


async def disconnected(raw_request: Request) -> None:
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass
