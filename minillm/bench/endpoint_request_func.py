"""The client side of an online benchmark (vLLM's benchmarks/lib/endpoint_request_func.py): one streamed request
to an OpenAI-compatible /v1/completions, timed chunk by chunk, and a whole load of them sent at their arrival times.

A request asks for greedy tokens with ignore_eos, so it generates exactly max_tokens; return_token_ids makes every
chunk carry its tokens (a chunk whose text is still held back by the detokenizer would otherwise look empty), and
stream_options.include_usage makes the last chunk count them. TTFT is the time from sending to the first chunk with
a token, ITL the gaps between the chunks with tokens after it, latency (E2EL) the time to the last one.
"""

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

TIMEOUT = httpx.Timeout(6 * 3600, connect=30)  # a request may queue behind many others on a busy server


@dataclass
class RequestFuncInput:
    """One request: its prompt (token ids or text), how many tokens it generates, and where it goes."""

    prompt: list[int] | str
    output_len: int
    model: str
    api_url: str  # the completions URL: <base>/v1/completions


@dataclass
class RequestFuncOutput:
    """What the client saw of one request; times in seconds, start on time.perf_counter's clock."""

    success: bool = False
    start: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0  # the usage's completion_tokens
    prompt_len: int = 0  # the usage's prompt_tokens
    error: str = ""


async def async_request_openai_completions(client: httpx.AsyncClient, request: RequestFuncInput) -> RequestFuncOutput:
    """Send one streamed completion and time its chunks. Failures (an HTTP error status, an error event, a broken
    connection, no usage at the end) come back as success=False with the reason in error, never raised."""
    body = dict(
        model=request.model,
        prompt=request.prompt,
        max_tokens=request.output_len,
        temperature=0,
        ignore_eos=True,
        return_token_ids=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    out = RequestFuncOutput(start=time.perf_counter())
    last = out.start
    try:
        async with client.stream("POST", request.api_url, json=body, timeout=TIMEOUT) as response:
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}"
                return out
            async for line in response.aiter_lines():
                data = line.removeprefix("data:").strip()
                if not line.startswith("data:") or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = f"error event: {chunk['error'].get('message', chunk['error'])}"
                    return out
                if chunk.get("usage"):
                    out.output_tokens = chunk["usage"]["completion_tokens"]
                    out.prompt_len = chunk["usage"]["prompt_tokens"]
                if any(c.get("token_ids") or c.get("text") for c in chunk.get("choices") or []):
                    now = time.perf_counter()
                    if out.ttft:
                        out.itl.append(now - last)
                    else:
                        out.ttft = now - out.start
                    last = now
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    out.latency = last - out.start
    out.success = bool(out.ttft and out.output_tokens)
    if not out.success:
        out.error = "the stream ended without a token" if not out.ttft else "the stream ended without its usage"
    return out


def served_model(base_url: str) -> str:
    """The model a server serves (the first of its /v1/models): the name requests must give."""
    response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def send_all(
    base_url: str,
    model: str,
    prompts: list,
    output_lens: list[int],
    arrivals: list[float],
    max_concurrency: int | None = None,
) -> tuple[list[RequestFuncOutput], float]:
    """Send request i at arrivals[i] seconds from the start (open loop: whether earlier ones have finished or not),
    at most max_concurrency in flight when given (a request past it waits, and its clock starts when it is sent,
    as in vLLM). The outputs in request order, and the seconds from the start to the last one's end."""
    url = base_url.rstrip("/") + "/v1/completions"
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)) as client:
        start = time.perf_counter()

        async def one(i: int) -> RequestFuncOutput:
            await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
            request = RequestFuncInput(prompts[i], output_lens[i], model, url)
            if limit is None:
                return await async_request_openai_completions(client, request)
            async with limit:
                return await async_request_openai_completions(client, request)

        outputs = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        return outputs, time.perf_counter() - start
