"""python -m minillm.serve: an OpenAI-compatible HTTP server over AsyncLLM (FastAPI + uvicorn), as `vllm serve`.

Routes: /v1/completions, /v1/chat/completions (streamed as server-sent events with "stream": true),
/v1/models, /tokenize, /detokenize, /health and /metrics (Prometheus, vLLM's metric names). It listens on
127.0.0.1 (this machine only) unless --host says otherwise; Ctrl-C or SIGTERM stops it cleanly. Every refusal is
in OpenAI's error shape, and /openapi.json documents each route's, with the bounds of every field.
"""

import argparse
import importlib
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
from functools import partial

import jinja2
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from minillm.engine.async_llm import AsyncLLM
from minillm.entrypoints import COMPILED_BATCH_1, ENFORCE_EAGER_HELP
from minillm.entrypoints.openai.errors import add_exception_handlers
from minillm.entrypoints.openai.metrics import PrometheusStatLogger
from minillm.entrypoints.openai.middleware import AuthenticationMiddleware, RequestBodyLimitMiddleware
from minillm.entrypoints.openai.openapi import openapi_schema
from minillm.entrypoints.openai.outputs import (
    ChatChunks,
    CompletionChunks,
    HeldStream,
    LogprobFormatter,
    collect_answers,
    hold_for,
)
from minillm.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    random_id,
)
from minillm.entrypoints.openai.serving import (
    APIError,
    ModelLimits,
    add_request,
    check_prompt_length,
    check_structured_outputs,
    constraint_field,
    error_responses,
    stop_strings,
    streaming_response,
    to_json,
    to_sampling_params,
    tool_mode,
    usage,
    with_cancellation,
)

# vLLM's server flag (as an argparse dest) -> minillm's Config field
ENGINE_FLAGS = {
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "kv_cache_memory_bytes": "kvcache_memory_bytes",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    "block_size": "kvcache_block_size",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
}
# an event of a streamed answer, as OpenAPI 3.2's itemSchema describes one (FastAPI's own streams use it too)
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a chunk's JSON, an error's JSON, or [DONE] last"}},
}
MAX_REQUEST_BODY_BYTES = 1 << 20  # 1 MiB: some 250k tokens of text, more than any context minillm serves holds


def build_app(
    async_llm: AsyncLLM,
    model_name: str = "default",
    api_key: str | None = None,
    max_request_body_bytes: int = MAX_REQUEST_BODY_BYTES,
) -> FastAPI:
    """The app over async_llm's front end: its tokenizer, chat template and default sampling parameters serve the
    requests. Requests naming another model get 404. /metrics reads a registry of this app's own. With api_key,
    every route but /health, /metrics and the API's docs needs it (401)."""
    processor, tokenizer = async_llm.processor, async_llm.tokenizer
    if tokenizer is None:
        raise ValueError("the server needs the model's tokenizer (the engine has skip_tokenizer_init=True)")
    metrics = PrometheusStatLogger(model_name, async_llm.client.num_engines)
    async_llm.stat_loggers.append(metrics)
    defaults = processor.default_sampling_params()
    max_model_len = async_llm.config.max_model_len
    max_prompt_chars = max_model_len * processor.max_chars_per_token  # more cannot fit, whatever the text
    app = FastAPI(title="minillm", description=__doc__)
    if api_key:
        app.add_middleware(AuthenticationMiddleware, api_key=api_key)
    app.add_middleware(RequestBodyLimitMiddleware, max_bytes=max_request_body_bytes)  # the outermost: added last
    add_exception_handlers(app)
    limits = ModelLimits(processor.vocab_size, max_model_len, max_prompt_chars)
    formatter = LogprobFormatter(tokenizer)
    app.openapi = partial(openapi_schema, app, api_key is not None, limits)
    auth = (401,) if api_key else ()
    generate = dict(  # what /v1/completions and /v1/chat/completions document
        responses={
            200: {
                "description": "the answer: whole (JSON), or with stream: true as server-sent events, `data: <json>`"
                " then `data: [DONE]`",
                "content": {"application/json": {}, "text/event-stream": {"itemSchema": SSE_EVENT}},
            }
        }
        | error_responses(400, *auth, 404, 413, 429, 500),
    )

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(404, f"the model {name!r} does not exist: this server serves {model_name!r}", "model")

    def encode_chat(messages: list[ChatMessage], add_generation_prompt: bool = True, tools=None) -> list[int]:
        # a chat template adds text around the turns: the turns alone must fit already
        check_prompt_length(sum(len(m.text) for m in messages), max_prompt_chars, max_model_len, "messages")
        try:
            conversation = [m.as_dict() for m in messages]
            return processor.encode_chat(conversation, add_generation_prompt=add_generation_prompt, tools=tools)[0]
        except (ValueError, jinja2.TemplateError) as e:
            raise APIError(400, str(e), "messages") from None

    @app.get("/health", response_class=Response, responses=error_responses(503))
    async def health():
        """200 (no body, as vLLM's) while the engine serves; 503 once it has stopped."""
        if not async_llm.is_alive():
            raise APIError(503, f"the engine is not serving: {async_llm.error}")
        return Response(status_code=200)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics():
        """The engine's statistics in Prometheus' text format, under vLLM's metric names."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", responses=error_responses(*auth))
    async def models() -> ModelList:
        card = ModelCard(id=model_name, root=str(processor.model_path), max_model_len=max_model_len)
        return ModelList(data=[card])

    @app.post("/tokenize", responses=error_responses(400, *auth, 404, 413))
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        check_model(request.model)
        if (request.prompt is None) == (request.messages is None):
            raise APIError(400, "give either a prompt (text) or messages (a conversation), not both", "prompt")
        if request.messages is not None:
            tokens = encode_chat(request.messages, request.add_generation_prompt)
        else:
            check_prompt_length(len(request.prompt), max_prompt_chars, max_model_len, "prompt")
            tokens = tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        return TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=tokens)

    @app.post("/detokenize", responses=error_responses(400, *auth, 404, 413))
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        check_model(request.model)
        if bad := [t for t in request.tokens if t >= processor.vocab_size]:
            raise APIError(400, f"unknown token ids {bad[:5]}: ids must be in [0, {processor.vocab_size})", "tokens")
        return DetokenizeResponse(prompt=tokenizer.decode(request.tokens))

    @app.post("/v1/completions", response_model=CompletionResponse, **generate)
    @with_cancellation
    async def completions(request: CompletionRequest, raw_request: Request):
        check_model(request.model)
        params = to_sampling_params(request, defaults, limits)
        if isinstance(request.prompt, str):
            check_prompt_length(len(request.prompt), max_prompt_chars, max_model_len, "prompt")
        check_structured_outputs(params, constraint_field(request))
        stream = await add_request(async_llm, request.prompt, params, stop_strings(request), "prompt")
        echo = echoed(request, stream.prompt_token_ids)
        echo_logprobs = request.echo and request.logprobs is not None
        if request.stream:
            chunks = CompletionChunks(
                random_id("cmpl"),
                model_name,
                echo,
                stream.prompt_token_ids,
                formatter,
                request.logprobs,
                echo_logprobs,
                request.prompt_logprobs is not None,
            )
            hold = hold_for(params.logprobs is not None or params.prompt_logprobs is not None, None)
            return streaming_response(stream if hold is None else HeldStream(stream, hold), chunks, request)
        answers, prompt_logprobs = await collect_answers(stream, params.n)
        choices = []
        for index, answer in enumerate(answers):
            choice = CompletionChoice(
                index=index, text=echo + answer.text, finish_reason=answer.finish_reason, token_ids=answer.token_ids
            )
            if request.logprobs is not None:
                token_ids, steps = answer.token_ids, answer.logprobs
                if echo_logprobs:
                    prompt_steps = prompt_logprobs or [None] * len(stream.prompt_token_ids)
                    token_ids, steps = stream.prompt_token_ids + token_ids, list(prompt_steps) + steps
                choice.logprobs = formatter.completion(token_ids, steps, 0 if echo_logprobs else len(echo))[0]
            if request.prompt_logprobs is not None:
                choice.prompt_logprobs = formatter.prompt(prompt_logprobs)
            choices.append(choice)
        response = CompletionResponse(
            model=model_name,
            choices=choices,
            usage=usage(stream, sum(len(answer.token_ids) for answer in answers)),
            prompt_token_ids=stream.prompt_token_ids,
        )
        return Response(to_json(response, request.return_token_ids), media_type="application/json")

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, **generate)
    @with_cancellation
    async def chat_completions(request: ChatCompletionRequest, raw_request: Request):
        check_model(request.model)
        params = to_sampling_params(request, defaults, limits)
        tool = tool_mode(request)
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if tool else None  # for the template
        prompt = encode_chat(request.messages, tools=tools)
        check_structured_outputs(params, constraint_field(request))
        stream = await add_request(async_llm, prompt, params, stop_strings(request), "messages")
        top_logprobs = request.num_logprobs
        if request.stream:
            chunks = ChatChunks(
                random_id("chatcmpl"), model_name, formatter, top_logprobs, tool, request.prompt_logprobs is not None
            )
            hold = hold_for(params.logprobs is not None or params.prompt_logprobs is not None, tool)
            return streaming_response(stream if hold is None else HeldStream(stream, hold), chunks, request)
        answers, prompt_logprobs = await collect_answers(stream, params.n)
        choices = []
        for index, answer in enumerate(answers):
            if tool is None:
                message, finish_reason = ChatCompletionMessage(content=answer.text), answer.finish_reason
            else:
                message, finish_reason = tool.message(answer.text, answer.finish_reason)
            choice = ChatCompletionChoice(
                index=index, message=message, finish_reason=finish_reason, token_ids=answer.token_ids
            )
            if top_logprobs is not None:
                choice.logprobs = formatter.chat(answer.token_ids, answer.logprobs, top_logprobs)
            choices.append(choice)
        response = ChatCompletionResponse(
            model=model_name,
            choices=choices,
            usage=usage(stream, sum(len(answer.token_ids) for answer in answers)),
            prompt_token_ids=stream.prompt_token_ids,
        )
        if request.prompt_logprobs is not None:
            response.prompt_logprobs = formatter.prompt(prompt_logprobs)
        return Response(to_json(response, request.return_token_ids), media_type="application/json")

    def echoed(request: CompletionRequest, prompt_token_ids: list[int]) -> str:
        """With echo (vLLM's), the prompt's text, which the completion's follows; else ""."""
        if not request.echo:
            return ""
        if isinstance(request.prompt, str):
            return request.prompt
        return tokenizer.decode(prompt_token_ids, skip_special_tokens=request.skip_special_tokens)

    return app


def completion_chunk(response_id: str, model_name: str, echo: str, out, usage_info, first: bool) -> CompletionResponse:
    """One event of a streamed completion: the output's new text (the first after the echoed prompt, if any), or
    (out None) the usage."""
    choices = (
        []
        if out is None
        else [CompletionChoice(text=echo * first + out.text, finish_reason=out.finish_reason, token_ids=out.token_ids)]
    )
    return CompletionResponse(id=response_id, model=model_name, choices=choices, usage=usage_info)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: any free one), so the address is known before uvicorn starts."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m minillm.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint directory or a hub id (as LLM(...)); default: the embedded model")
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine)"
    )
    parser.add_argument("--port", type=int, default=8000, help="default 8000; 0 picks a free one")
    parser.add_argument(
        "--max-queue", type=int, default=256, help="requests waiting for their first token beyond which one gets 429"
    )
    parser.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="N engine cores (processes, each with the whole model and its own KV cache), each new request sent to "
        "the least loaded; a core that dies is restarted (chapter 15; default 1)",
    )
    engine = parser.add_argument_group("engine settings (vLLM's flags; default: minillm's Config)")
    for flag in ENGINE_FLAGS:
        engine.add_argument(f"--{flag.replace('_', '-')}", type=int, metavar="N")
    engine.add_argument("--enforce-eager", action="store_true", help=ENFORCE_EAGER_HELP)
    engine.add_argument(
        "--scheduling-policy", choices=["fcfs", "priority"], help="the waiting queue's order (default fcfs)"
    )
    engine.add_argument(
        "--no-mixed-steps",
        dest="mixed_steps",
        action="store_false",
        help="a step is all prefill or all decode (chapter 06), not the running requests' tokens and prompt chunks",
    )
    engine.add_argument(
        "--speculative-config",
        type=json.loads,
        metavar="JSON",
        help='speculative decoding (chapter 13), e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\'',
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("MINILLM_API_KEY"),
        help="require `Authorization: Bearer <key>` on every route but /health, /metrics and the docs (vLLM's flag; "
        "default: $MINILLM_API_KEY, which keeps the key off the command line)",
    )
    parser.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=MAX_REQUEST_BODY_BYTES,
        metavar="N",
        help=f"larger request bodies get 413, refused before they are read (default {MAX_REQUEST_BODY_BYTES}: 1 MiB)",
    )
    args = parser.parse_args(argv)
    if args.max_queue < 1:
        parser.error(f"--max-queue must be >= 1, got {args.max_queue}")
    if args.max_request_body_bytes < 1:
        parser.error(f"--max-request-body-bytes must be >= 1, got {args.max_request_body_bytes}")
    return args


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What to warn about when the server listens beyond this machine (host: an IP address) with no API key."""
    if api_key is None and not ipaddress.ip_address(host).is_loopback:
        return (
            f"{host} is reachable from other machines and no API key is set: anyone who reaches it can use this "
            "server (set --api-key or MINILLM_API_KEY)"
        )
    return None


def engine_options(args) -> dict:
    """LLM(...) keywords from the engine flags given."""
    given = {ours: getattr(args, flag) for flag, ours in ENGINE_FLAGS.items() if getattr(args, flag) is not None}
    given |= {} if args.speculative_config is None else {"speculative_config": args.speculative_config}
    given |= {} if args.scheduling_policy is None else {"scheduling_policy": args.scheduling_policy}
    parallel = (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1) > 1  # their steps run eager
    given |= {} if args.enforce_eager or parallel else COMPILED_BATCH_1
    return given | ({} if args.mixed_steps else {"mixed_steps": False})


def main(argv=None) -> int:
    args = parse_args(argv)
    try:  # the engine core in a process of its own, this one the front end
        async_llm = AsyncLLM.from_engine_args(
            args.model, max_queue=args.max_queue, data_parallel_size=args.data_parallel_size, **engine_options(args)
        )
    except KeyboardInterrupt:  # Ctrl-C while the model loads
        return 130
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # no such checkpoint, one minillm cannot run
        print(f"python -m minillm.serve: {e}", file=sys.stderr)
        return 1
    model_name = args.model or "default"
    # imported now, beside the server: the first structured request would import it (seconds) on the event loop,
    # stalling every stream meanwhile
    threading.Thread(target=importlib.import_module, args=("xgrammar",), name="import-xgrammar", daemon=True).start()
    app = build_app(async_llm, model_name, args.api_key, args.max_request_body_bytes)
    try:
        sock = listen(args.host, args.port)
    except OSError as e:
        async_llm.close()
        print(f"python -m minillm.serve: cannot listen on {args.host}:{args.port}: {e.strerror}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    if warning := exposure_warning(host, args.api_key):
        print(f"python -m minillm.serve: warning: {warning}", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=host, port=port, lifespan="off", timeout_graceful_shutdown=5)
    print(f"minillm serves {model_name} at {url(sock)} (the OpenAI API under /v1; Ctrl-C stops)", flush=True)
    # uvicorn handles SIGINT and SIGTERM (finish the requests in flight, 5 s at most), then raises the signal again:
    # SIGINT as KeyboardInterrupt, SIGTERM as this SystemExit, so that the engine core's process is stopped here
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        async_llm.close()
        sock.close()
    print("minillm server stopped", flush=True)
    return 0
