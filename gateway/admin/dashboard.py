"""The fleet dashboard: a static page (gateway/static/, no build step, no external URL) and the JSON it polls.

  GET /dashboard               the page; public, like /metrics (it holds no data)
  GET /dashboard/{asset}       its script and style sheet; public
  GET /dashboard/fleet.json    the fleet now: every worker reporting (draining ones too) with its load, KV use
                               and counters, each known model's queue depth, and the fleet's recent errors.
                               Needs an API key when keys are configured (the page sends the one typed in);
                               it is not counted against the key's rate limits (the page polls every 2 s).

Rates (tokens per second) are not computed here: the page derives them from the workers' counters between
two polls and keeps the last minutes of history itself, so every gateway stays stateless.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.replies.request_body import registry_and_pool
from shared.registry import RegistryEntry

PAGE_PATH = "/dashboard"
FLEET_PATH = "/dashboard/fleet.json"
ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
PUBLIC_PATHS = frozenset({PAGE_PATH, PAGE_PATH + "/", *(f"{PAGE_PATH}/{name}" for name in ASSETS)})
# the page may talk to its own origin only: no inline script, no external URL of any kind
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
IN_FLIGHT = "llmfleet_gateway_requests_in_flight"
WORKER_STATS = ("prompt_tokens", "generated_tokens", "requests_finished", "requests_failed", "requests_cancelled",
                "preemptions", "prefix_queries", "prefix_hits", "steps", "kv_tier_hits", "kv_tier_misses",
                "kv_tier_tokens_hit", "kv_tier_bytes_used")


def _static(name: str) -> bytes:
    return (resources.files("gateway") / "static" / name).read_bytes()


async def page(_request: Request) -> Response:
    """GET /dashboard: the page."""
    return Response(_static("index.html"), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


async def asset(request: Request) -> Response:
    """GET /dashboard/{asset}: the page's script or style sheet (a fixed list; anything else is a 404)."""
    name = request.path_params["asset"]
    if name not in ASSETS:
        raise HTTPException(404)
    return Response(_static(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)


def worker_view(entry: RegistryEntry, now: float) -> dict[str, Any]:
    """One worker as the page shows it."""
    stats = entry.stats
    used, total = stats.get("kv_blocks_used", 0.0), stats.get("kv_blocks_total", 0.0)
    return {
        "id": entry.worker_id, "model": entry.model, "host": entry.host, "state": entry.state,
        "slots": entry.slots, "running": int(stats.get("active", entry.load)),
        "waiting": int(stats.get("queue_depth", 0)), "kv_blocks_used": int(used), "kv_blocks_total": int(total),
        "kv_usage": round(used / total, 4) if total else None, "served": entry.served,
        "heartbeat": entry.heartbeat, "heartbeat_age_s": round(max(0.0, now - entry.heartbeat), 2),
        "uptime_s": round(max(0.0, now - entry.started), 1), "version": entry.version,
        "stats": {name: int(stats[name]) for name in WORKER_STATS if name in stats},
    }


async def fleet_view(broker: Broker, registry: Registry) -> dict[str, Any]:
    """What GET /dashboard/fleet.json answers (see the module docstring)."""
    now = broker.clock()
    workers = await registry.reporting_workers()
    models = sorted(set(await registry.known_models()) | {w.model for w in workers})
    queues = []
    for model in models:
        serving = [w for w in workers if w.model == model]
        queues.append({"model": model, "waiting": await broker.waiting(model),
                       "workers": sum(1 for w in serving if w.is_live(now, broker.settings.heartbeat_ttl_s)),
                       "running": sum(int(w.stats.get("active", w.load)) for w in serving)})
    return {
        "time": now,
        "workers": [worker_view(w, now) for w in sorted(workers, key=lambda w: (w.model, w.host, w.worker_id))],
        "models": queues,
        "errors": await broker.errors.recent(),
        "gateway": {"requests_in_flight": int(broker.metrics.registry.get_sample_value(IN_FLIGHT) or 0),
                    "errors_not_recorded": broker.errors.dropped},
    }


async def fleet(request: Request) -> Response:
    """GET /dashboard/fleet.json: the fleet now (workers, queues, recent errors)."""
    started = time.monotonic()
    body = await fleet_view(request.app.state.broker, registry_and_pool(request)[0])
    body["elapsed_ms"] = round((time.monotonic() - started) * 1000, 2)
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


ROUTES = [
    Route(PAGE_PATH, page, methods=["GET"]),
    Route(FLEET_PATH, fleet, methods=["GET"]),
    Route(PAGE_PATH + "/{asset}", asset, methods=["GET"]),
]
