"""The gateway's Starlette application factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from redis import Redis as SyncRedis
from redis import RedisCluster as SyncRedisCluster
from redis.asyncio import BlockingConnectionPool, Redis
from redis.sentinel import Sentinel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from batches.redis_clients import async_client, primary_options
from batches.routes import ROUTES as BATCH_ROUTES
from batches.routes import UPLOAD_OVERHEAD_BYTES, UPLOAD_PATHS
from gateway.admin.router import ROUTES as ADMIN_ROUTES
from gateway.admin.router import UNMETERED_PATHS, open_paths
from gateway.anthropic import errors as anthropic_errors
from gateway.anthropic.router import ROUTES as ANTHROPIC_ROUTES
from gateway.cluster.broker import Broker
from gateway.cluster.lora_set import LoraSet
from gateway.cluster.redis_health import DOWN_AFTER_S
from gateway.cluster.registry import Registry
from gateway.cluster.warm_pool import WarmPool
from gateway.http import errors as http_errors
from gateway.http.api_keys import KeyStore
from gateway.http.disconnect import ClientDisconnected
from gateway.http.middleware import ApiKeyMiddleware, BodyLimitMiddleware
from gateway.http.sse import warm_task_groups
from gateway.http.tracing import TracingMiddleware
from gateway.llamacpp.router import ROUTES as LLAMACPP_ROUTES
from gateway.ollama import errors as ollama_errors
from gateway.ollama.router import ROUTES as OLLAMA_ROUTES
from gateway.openai.router import ROUTES as OPENAI_ROUTES
from gateway.responses_api import serving as responses_serving
from gateway.responses_api.router import ROUTES as RESPONSES_ROUTES
from shared import tracing
from shared.errors import LLMFleetError
from shared.heap import freeze_start_up
from shared.redis_commands import sharded
from shared.settings import Settings

log = logging.getLogger(__name__)
POOL_WAIT_S = 5.0
CLIENT_CLOSED_REQUEST = 499  # nginx's status for 'the client went away'; nobody receives it
ERROR_SHAPES = (  # the APIs whose errors are not OpenAI-shaped, for gateway/http/errors.py
    http_errors.ErrorShape(anthropic_errors.is_anthropic_path, anthropic_errors.error_body),
    http_errors.ErrorShape(ollama_errors.is_ollama_path, ollama_errors.error_body),
)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that went away (before its body was read, or before its answer was ready) is an INFO line: an
    ordinary event, not a server error; its jobs were already closed (cancelled) on the way out."""
    where = "before its request body was read" if isinstance(exc, ClientDisconnect) else "before the answer"
    log.info("client disconnected %s (%s %s)", where, request.method, request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def _redis_client(settings: Settings) -> Redis:
    """A client whose pool makes requests wait for a free connection instead of failing when all are busy, and
    whose sockets are bounded (shared/redis_sockets.py): a command on a connection a partition cut fails in
    COMMAND_TIMEOUT_S (a 503) instead of hanging until TCP gives up. Under Sentinel each new connection dials
    the primary the sentinels name (batches/redis_clients.py)."""
    # no keepalive (shared/redis_sockets.py); a pooled connection that died (Redis restarted, or its primary
    # failed over) is redialled on its next use instead of failing the request; a timeout is not retried. No
    # health_check_interval: its PING would race the shared pub/sub connection's reader
    return async_client(settings.redis_target, pool_class=BlockingConnectionPool,
                        max_connections=settings.redis_max_connections, timeout=POOL_WAIT_S)


def _probe_client(settings: Settings) -> SyncRedis | SyncRedisCluster:
    """The health probe's own blocking client (gateway/cluster/redis_health.py): a PING unanswered in DOWN_AFTER_S fails."""
    bounds = {"socket_timeout": DOWN_AFTER_S, "socket_connect_timeout": DOWN_AFTER_S}
    target = settings.redis_target
    if target.cluster:  # PING goes to every node: Redis "answers" only while all of them do
        return SyncRedisCluster.from_url(settings.redis_url, **bounds)
    if not target.sentinel:
        return SyncRedis.from_url(settings.redis_url, **bounds)
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=bounds)
    return sentinel.master_for(target.master, **primary_options(target), **bounds)


def create_app(settings: Settings | None = None, redis: Redis | None = None) -> Starlette:
    """Build the gateway; `redis` (bytes responses, e.g. a FakeRedis in tests) replaces REDIS_URL.

    An injected client should have a pool large enough for the concurrency it will see (redis-py's default
    pool refuses the 101st concurrent command); the gateway's own client uses a blocking pool.
    """
    settings = settings or Settings.from_env()
    tracing.configure("llmfleet-gateway")  # OpenTelemetry, when OTEL_EXPORTER_OTLP_ENDPOINT is set (once a process)
    app = Starlette(
        routes=[*OPENAI_ROUTES, *BATCH_ROUTES, *LLAMACPP_ROUTES, *ANTHROPIC_ROUTES, *ADMIN_ROUTES, *RESPONSES_ROUTES, *OLLAMA_ROUTES],
        middleware=_middleware(settings),
        exception_handlers={
            LLMFleetError: http_errors.handle_llmfleet_error,
            HTTPException: http_errors.handle_http_exception,
            ClientDisconnected: _client_gone,
            ClientDisconnect: _client_gone,
            Exception: http_errors.handle_unexpected,
        },
        lifespan=_lifespan(settings, redis),
    )
    app.state.settings = settings
    app.state.error_shapes = ERROR_SHAPES
    return app


def _lifespan(settings: Settings, redis: Redis | None) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """Open Redis and the broker for the app's lifetime (`redis`: an injected client, left open)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = redis if redis is not None else _redis_client(settings)
        if sharded(client):  # the slots first: redis-py 8.1 fails a MULTI sent as an async cluster client's first command
            await client.initialize()  # type: ignore[attr-defined]
        probe = None if redis is not None else _probe_client(settings)
        registry = Registry(client, settings)  # which workers are alive, which models known
        pool = WarmPool(client, settings, registry)  # the node agents' catalogues and load / unload commands
        broker = Broker(client, settings, registry, pool, ping=probe.ping if probe is not None else None)
        responses_serving.install(broker, registry, settings)  # finish a dead gateway's background responses
        await broker.start()
        await warm_task_groups()  # not in the first stream's time to first token
        freeze_start_up()  # a full collection under load scans only what requests made
        app.state.broker = broker  # submit, cancel, events (admission reads the registry and pool it was handed)
        app.state.registry, app.state.pool = registry, pool  # what routes read of the fleet
        app.state.loras = LoraSet(client, settings)  # the adapters each model should have (the admin API's)
        try:
            yield
        finally:
            await broker.close()
            if redis is None:
                await client.aclose()
            if probe is not None:
                probe.close()
            rq_redis = getattr(app.state, "rq_redis", None)
            if rq_redis is not None:
                rq_redis.close()

    return lifespan


def _middleware(settings: Settings) -> list[Middleware]:
    """CORS (outermost: preflights need no key), tracing, API keys and limits, the body cap."""
    origins = [origin.strip() for origin in settings.cors_origins.split(",") if origin.strip()]
    cors = [Middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                       allow_headers=["*"], max_age=600)] if origins else []
    keys = KeyStore(Path(settings.keys_file).expanduser() if settings.keys_file else None, settings.api_key)
    return [
        *cors,
        Middleware(TracingMiddleware),
        Middleware(ApiKeyMiddleware, keys=keys, open_paths=open_paths(bool(settings.public_metrics)),
                   unmetered_paths=UNMETERED_PATHS),
        Middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, upload_paths=UPLOAD_PATHS,
                   max_upload_bytes=settings.max_file_bytes + UPLOAD_OVERHEAD_BYTES),
    ]
