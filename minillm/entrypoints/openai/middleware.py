"""Two checks at the server's edge, as plain ASGI middleware: they run before any route, and they refuse in OpenAI's
error shape.

- RequestBodyLimitMiddleware: a body larger than the limit gets 413, decided from its Content-Length header before
  a byte of it is read, or, for a body sent in chunks without one, as soon as the bytes received pass the limit.
  So a 10 MB request costs at most the limit in memory. (FastAPI's own max_body_size answers some of its 413s in
  plain text: when a route answers before reading the body.)
- AuthenticationMiddleware (vLLM's, for `--api-key`): every route but the public ones needs
  `Authorization: Bearer <key>`, else 401. Health probes, Prometheus and the API's schema stay open, as in vLLM.
"""

import hashlib
import secrets

from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from minillm.entrypoints.openai.serving import APIError

# sent with a 413: the connection is closed once answered, so the rest of the body is never read (kept alive, the
# server would go on reading and dropping it, between the running streams' tokens)
CLOSE = {"Connection": "close"}
PUBLIC_ENDPOINTS = ("/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")  # vLLM's


class RequestBodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self.too_large(int(declared)).response(CLOSE)(scope, receive, send)
        received = 0

        async def counted_receive():
            """The next piece of the body, counted: past the limit, the route reading the body gets a 413 (FastAPI
            passes an HTTPException raised while it reads the body on to the exception handlers)."""
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                error = self.too_large(received, "at least ")
                raise HTTPException(error.status, str(error), CLOSE)
            return message

        await self.app(scope, counted_receive, send)

    def too_large(self, size: int, at_least: str = "") -> APIError:
        return APIError(
            413,
            f"the request body has {at_least}{size} bytes, more than this server's limit of {self.max_bytes}: send a "
            "shorter prompt, or start the server with a larger --max-request-body-bytes",
        )


class AuthenticationMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        # compare digests in constant time: how long a comparison takes tells nothing about the key
        self.app, self.key_digest = app, hashlib.sha256(api_key.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope["path"]) or self.verify(Headers(scope=scope)):
            return await self.app(scope, receive, send)
        error = APIError(401, "a valid API key is required: send the header `Authorization: Bearer <key>`")
        response = error.response()
        response.headers["WWW-Authenticate"] = "Bearer"  # RFC 6750: the scheme the client should use
        await response(scope, receive, send)

    def verify(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            hashlib.sha256(token.encode()).digest(), self.key_digest
        )


def is_public(path: str) -> bool:
    """Whether `path` is one of PUBLIC_ENDPOINTS or under one (on a segment boundary: /healthz is not /health)."""
    return any(path == public or path.startswith(public + "/") for public in PUBLIC_ENDPOINTS)
