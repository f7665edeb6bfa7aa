"""ASGI middleware: API-key check and request-body cap; both answer in OpenAI's error shape."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http_errors import error_response
from shared.errors import AuthenticationFailed, BodyTooLarge, InvalidRequest

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ApiKeyMiddleware:
    """Require `Authorization: Bearer <LLMFLEET_API_KEY>` on everything but /health, /ready and /metrics."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("authorization")
        if given is None:
            error = AuthenticationFailed(
                "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'."
            )
        elif not hmac.compare_digest(given.encode(), self.expected):
            error = AuthenticationFailed("Incorrect API key provided.")
        else:
            await self.app(scope, receive, send)
            return
        response = error_response(error)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413: by Content-Length up front, else while they stream in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await error_response(InvalidRequest("Invalid Content-Length header."))(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await error_response(self._too_large())(scope, receive, send)
                return
        received = 0

        async def limited_receive() -> Message:
            """Pass messages through, counting body bytes."""
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large()  # raised inside the handler's body read -> 413 handler
            return message

        await self.app(scope, limited_receive, send)

    def _too_large(self) -> BodyTooLarge:
        return BodyTooLarge(f"The request body is larger than the limit of {self.max_bytes} bytes.")
