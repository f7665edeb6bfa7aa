"""Operators' routes: /metrics, /health, /ready, /ready/gateway, then the dashboard's and the admin API's."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin import dashboard, lora_routes, model_routes, readiness
from gateway.admin.openapi import openapi_document
from gateway.cluster.broker import Broker
from gateway.cluster.metrics import CONTENT_TYPE, FleetSnapshot, fleet_snapshot
from gateway.replies.request_body import registry_and_pool
from shared.errors import LLMFleetError

OPEN_PATHS = frozenset({"/health", "/ready", "/ready/gateway", "/metrics", "/openapi.json", *dashboard.PUBLIC_PATHS})
UNMETERED_PATHS = frozenset({dashboard.FLEET_PATH})  # a key is needed, but no rate limit (the dashboard polls it)


def open_paths(public_metrics: bool) -> frozenset[str]:
    """The paths that need no API key (gateway/http/middleware.py): /metrics among them unless configured closed."""
    return OPEN_PATHS if public_metrics else OPEN_PATHS - {"/metrics"}


async def metrics(request: Request) -> Response:
    """GET /metrics: Prometheus text of this gateway's requests and the whole fleet's workers and queues."""
    broker: Broker = request.app.state.broker
    registry, _pool = registry_and_pool(request)
    try:
        snapshot = await fleet_snapshot(registry, broker.queue_state)
    except LLMFleetError:  # Redis away: still export this gateway's own numbers
        snapshot = FleetSnapshot()
    return Response(broker.metrics.render(snapshot), media_type=CONTENT_TYPE)


async def health(_request: Request) -> Response:
    """GET /health: the process is up."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    """GET /ready: every model the deployment was started with has a live, loaded worker (503 naming the rest);
    with none required, Redis answers and a worker or node agent is alive. See gateway/admin/readiness.py.
    `degraded`: a required model failed to load, or `serve` gave up on (or misses) a worker."""
    broker: Broker = request.app.state.broker
    verdict = await readiness.assess(broker, *registry_and_pool(request))
    body = verdict.to_json()
    supervisor = await broker.supervisor_status() if verdict.redis else None
    failed = any(state == readiness.FAILED for state in verdict.models.values())  # a required model's load failed
    if supervisor is not None:
        body["supervisor"] = supervisor
        body["degraded"] = failed or bool(supervisor["workers_given_up"]) or \
            supervisor["workers_running"] < supervisor["workers_expected"]
    elif failed:
        body["degraded"] = True
    return JSONResponse(body, status_code=200 if verdict.ready else 503)


async def gateway_ready(request: Request) -> Response:
    """GET /ready/gateway: this gateway can take and queue requests (Redis answers), workers or not."""
    redis_ok = await request.app.state.broker.ping()
    return JSONResponse({"ready": redis_ok, "redis": redis_ok}, status_code=200 if redis_ok else 503)


async def openapi_json(request: Request) -> Response:
    """GET /openapi.json: the gateway's OpenAPI document, with its configured limits."""
    return JSONResponse(openapi_document(request.app.state.settings))


ROUTES = [
    *lora_routes.ROUTES,
    Route("/metrics", metrics, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/ready/gateway", gateway_ready, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    *dashboard.ROUTES,
    *model_routes.ROUTES,
]
