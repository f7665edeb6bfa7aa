"""The gateway's Starlette application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from gateway import http_errors
from gateway.broker import Broker
from gateway.disconnect import ClientDisconnected
from gateway.middleware import ApiKeyMiddleware, BodyLimitMiddleware
from gateway.routes import ROUTES
from shared.errors import LLMFleetError
from shared.settings import Settings

CLIENT_CLOSED_REQUEST = 499  # nginx's status for 'the client went away'; nobody receives it


async def _client_gone(_request: Request, _exc: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def create_app(settings: Settings | None = None, redis: Redis | None = None) -> Starlette:
    """Build the gateway; `redis` (bytes responses, e.g. a FakeRedis in tests) replaces REDIS_URL."""
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = redis if redis is not None else Redis.from_url(settings.redis_url, socket_connect_timeout=5)
        broker = Broker(client, settings)
        await broker.start()
        app.state.broker = broker
        try:
            yield
        finally:
            await broker.close()
            if redis is None:
                await client.aclose()

    app = Starlette(
        routes=ROUTES,
        middleware=[
            Middleware(ApiKeyMiddleware, api_key=settings.api_key),
            Middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes),
        ],
        exception_handlers={
            LLMFleetError: http_errors.handle_llmfleet_error,
            HTTPException: http_errors.handle_http_exception,
            ClientDisconnected: _client_gone,
            Exception: http_errors.handle_unexpected,
        },
        lifespan=lifespan,
    )
    app.state.settings = settings
    return app
