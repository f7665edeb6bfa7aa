"""The warm pool's admin API (behind the API key, like every non-public route):

- GET /admin/models: every catalogued or served model: status (loading / ready / failed / unloaded),
  replicas, memory, last use, in flight and queued requests, the nodes that hold it.
- POST /admin/models/load {"model", "wait": true, "timeout": s}: ask the node agents for a replica (a
  remembered failure is forgotten: this is the explicit retry); waits until it is ready (200), failed (503)
  or the timeout passed (202, still loading).
- POST /admin/models/unload {"model", "force": false}: refused (409 model_busy) while its workers have
  requests in flight or queued, unless forced: then its workers drain (finish what they hold) and exit.
- POST /admin/kv-tier/drop {"model"}: every host empties its KV tier file of the model (its workers see the
  `{model}:kv-tier-drop` counter grow at their next heartbeat, within LLMFLEET_HEARTBEAT_INTERVAL_S).
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cluster.broker import Broker
from gateway.cluster.warm_pool import ModelStatus, WarmPool
from gateway.http.fields import boolean, number, parse_json_object, string
from gateway.replies.request_body import registry_and_pool
from shared import keys
from shared.errors import ModelBusy, ModelLoadFailed, ModelNotFound
from shared.warm_pool import FAILED, READY, UNLOADED

POLL_S = 0.25
MAX_WAIT_S = 600.0


async def _status(pool: WarmPool, broker: Broker, model: str) -> ModelStatus | None:
    return next((s for s in await pool.statuses(broker.queue_state) if s.model == model), None)


async def _model(request: Request) -> tuple[Broker, WarmPool, dict, str, ModelStatus]:
    """The body, and the named model's status; 404 when no live node or worker knows the model."""
    broker: Broker = request.app.state.broker
    _registry, pool = registry_and_pool(request)
    body = parse_json_object(await request.body())
    model = string(body, "model", max_len=512)
    status = await _status(pool, broker, model)
    if status is None:
        raise ModelNotFound(f"The model '{model}' is in no live node's catalogue and no worker serves it",
                            param="model")
    return broker, pool, body, model, status


async def list_pool_models(request: Request) -> Response:
    """GET /admin/models"""
    broker: Broker = request.app.state.broker
    statuses = await registry_and_pool(request)[1].statuses(broker.queue_state)
    return JSONResponse({"object": "list", "data": [s.to_json() for s in statuses]})


async def load_model(request: Request) -> Response:
    """POST /admin/models/load"""
    broker, pool, body, model, status = await _model(request)
    wait = boolean(body, "wait", True)
    timeout = number(body, "timeout", broker.settings.pool_load_timeout_s, 0, MAX_WAIT_S)
    if status.status != READY:
        if not status.catalogued:
            raise ModelNotFound(f"The model '{model}' is in no live node's catalogue", param="model")
        await pool.command("load", model)
    deadline = time.monotonic() + (timeout if wait else 0)
    while True:
        status = await _status(pool, broker, model) or status
        if status.status == READY:
            return JSONResponse(status.to_json())
        if status.status == FAILED:
            raise ModelLoadFailed(status.error or f"model '{model}' could not be loaded",
                                  retry_after=broker.settings.pool_failure_ttl_s)
        if time.monotonic() >= deadline:
            return JSONResponse(status.to_json(), status_code=202)
        await asyncio.sleep(POLL_S)


async def unload_model(request: Request) -> Response:
    """POST /admin/models/unload"""
    broker, pool, body, model, status = await _model(request)
    force = boolean(body, "force", False)
    if (status.in_flight or status.queued) and not force:
        raise ModelBusy(f"model '{model}' has {status.in_flight} sequences in flight and {status.queued} requests "
                        "queued; retry when it is idle, or send \"force\": true to drain them and unload",
                        param="model")
    if status.replicas or status.loading:
        await pool.command("unload", model, force=force)
    deadline = time.monotonic() + broker.settings.drain_timeout_s + 10
    while status.replicas and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        status = await _status(pool, broker, model) or status
    body_out = status.to_json()
    if not status.replicas and status.status == READY:
        body_out["status"] = UNLOADED
    return JSONResponse(body_out, status_code=200 if not status.replicas else 202)


async def drop_kv_tier(request: Request) -> Response:
    """POST /admin/kv-tier/drop"""
    broker: Broker = request.app.state.broker
    model = string(parse_json_object(await request.body()), "model", max_len=512)
    drops = await broker.redis.incr(keys.kv_tier_drop(model))
    return JSONResponse({"object": "kv_tier.drop", "model": model, "drops": int(drops)})


ROUTES = [
    Route("/admin/models", list_pool_models, methods=["GET"]),
    Route("/admin/models/load", load_model, methods=["POST"]),
    Route("/admin/models/unload", unload_model, methods=["POST"]),
    Route("/admin/kv-tier/drop", drop_kv_tier, methods=["POST"]),
]
