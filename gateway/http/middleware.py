"""ASGI middleware: API-key check and request-body cap; both answer in OpenAI's error shape (or the one an API
registered for its paths: gateway/http/errors.py). Which paths need no key is given by app.py (admin's)."""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.api_keys import KeyRecord, KeyStore, current_key
from gateway.http.errors import error_response, record_error
from gateway.http.redis_errors import redis_unavailable
from gateway.http.tenants import TENANT_HEADER, note_requested
from shared.errors import AuthenticationFailed, BodyTooLarge, InvalidRequest, LLMFleetError, RateLimited

log = logging.getLogger(__name__)



class ApiKeyMiddleware:
    """Require a known key (`Authorization: Bearer <key>` or `X-Api-Key: <key>`) on everything but the open
    paths and CORS preflights; apply the key's rate limits and add OpenAI's x-ratelimit-* headers."""

    def __init__(self, app: ASGIApp, keys: KeyStore, *, open_paths: frozenset[str] = frozenset(),
                 unmetered_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = open_paths  # no key needed
        self.unmetered_paths = unmetered_paths  # a key is needed, but no rate limit applies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.keys.enabled and scope["type"] == "http":  # the tenant of fair shares (gateway/http/tenants.py)
            note_requested(Headers(scope=scope).get(TENANT_HEADER))
        if (not self.keys.enabled or scope["type"] != "http" or scope["path"] in self.open_paths
                or scope["method"] == "OPTIONS"):
            await self.app(scope, receive, send)
            return
        record = await self._authenticate(scope, receive, send)
        if record is None:
            return
        limit_headers = await self._limit(record, scope, receive, send)
        if limit_headers is None:
            return
        log.info("key %s: %s %s", record.name, scope["method"], scope["path"])
        token = current_key.set(record)
        try:
            await self.app(scope, receive, _with_headers(send, limit_headers))
        finally:
            current_key.reset(token)

    async def _authenticate(self, scope: Scope, receive: Receive, send: Send) -> KeyRecord | None:
        """The presented key's record, or None after answering 401."""
        presented = _presented_key(Headers(scope=scope))
        record = None if presented is None else self.keys.lookup(presented)
        if record is not None:
            return record
        error = AuthenticationFailed(
            "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY' "
            "(or as X-Api-Key)." if presented is None else "Incorrect API key provided.")
        response = error_response(error, scope["path"], scope["app"].state)
        response.headers["WWW-Authenticate"] = "Bearer"
        if scope["path"] not in self.unmetered_paths:  # a dashboard waiting for its key is not an error to list
            record_error(scope["app"].state, error, scope["path"])
        await response(scope, receive, send)
        return None

    async def _limit(self, record: KeyRecord, scope: Scope, receive: Receive, send: Send) -> dict[str, str] | None:
        """Apply the key's per-minute limits: the x-ratelimit-* headers to add, or None after answering 429 (or
        503 when Redis cannot say)."""
        if not (record.rpm or record.tpm) or scope["path"] in self.unmetered_paths:
            return {}
        broker = scope["app"].state.broker
        try:
            with redis_unavailable(broker.settings.retry_after_s):
                states = await broker.limiter.admit(record)
        except LLMFleetError as exc:  # raised outside the app's handlers: answer here
            record_error(scope["app"].state, exc, scope["path"], key_name=record.name)
            await error_response(exc, scope["path"], scope["app"].state)(scope, receive, send)
            return None
        limit_headers = {name: value for state in states for name, value in state.headers().items()}
        denied = [s for s in states if not s.allowed]
        if not denied:
            return limit_headers
        broker.metrics.rate_limited.labels(record.name, denied[0].kind).inc()
        log.info("key %s: %s per minute limit reached", record.name, denied[0].kind)
        limited = RateLimited(
            f"Rate limit reached for {denied[0].kind} per minute ({denied[0].limit}) on key "
            f"'{record.name}'. Please try again in {max(s.retry_after_s for s in denied):g}s.",
            retry_after=max(s.retry_after_s for s in denied))
        record_error(scope["app"].state, limited, scope["path"], key_name=record.name)
        response = error_response(limited, scope["path"], scope["app"].state)
        response.headers.update(limit_headers)
        await response(scope, receive, send)
        return None


def _with_headers(send: Send, headers: dict[str, str]) -> Send:
    """`send`, adding `headers` to the response's start."""
    if not headers:
        return send

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              *((k.encode(), v.encode()) for k, v in headers.items())]}
        await send(message)

    return send_with_headers


def _presented_key(headers: Headers) -> str | None:
    """The key of `Authorization: Bearer <key>`, else of `X-Api-Key`, else None."""
    authorization = headers.get("authorization")
    if authorization is not None and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    api_key = headers.get("x-api-key")
    return api_key.strip() if api_key else None


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413: by Content-Length up front, else while they stream in.

    POSTs to `upload_paths` (file uploads) have their own, larger limit, `max_upload_bytes`.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, upload_paths: frozenset[str] = frozenset(),
                 max_upload_bytes: int = 0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_paths = upload_paths
        self.max_upload_bytes = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in self.upload_paths and scope["method"] == "POST":
            await BodyLimitMiddleware(self.app, max(self.max_bytes, self.max_upload_bytes))(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                error = InvalidRequest("Invalid Content-Length header.")
                await error_response(error, scope["path"], scope["app"].state)(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await error_response(self._too_large(), scope["path"], scope["app"].state)(scope, receive, send)
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
