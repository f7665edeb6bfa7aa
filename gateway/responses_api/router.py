"""Responses API routes (/v1/responses and, as llama-server serves OpenAI's routes, /responses): each one reads
the body, calls the serving module and maps the result to a response."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.http.api_keys import current_key
from gateway.http.disconnect import unless_disconnected
from gateway.http.sse import SSEResponse
from gateway.replies import resume
from gateway.replies.request_body import registry_and_pool, request_body
from gateway.replies.tool_calls import dropped_headers
from gateway.responses_api import bodies, items, serving
from gateway.responses_api.protocol import parse_request
from gateway.responses_api.store import ResponseStore
from shared.settings import Settings


def _state(request: Request) -> tuple[Broker, ResponseStore, Settings]:
    broker, settings = request.app.state.broker, request.app.state.settings
    return broker, ResponseStore(broker.redis, settings), settings


def _registry(request: Request) -> Registry:
    return registry_and_pool(request)[0]


def _key_name() -> str | None:
    key = current_key.get()
    return key.name if key is not None else None


async def create(request: Request) -> Response:
    """POST /v1/responses"""
    broker, store, settings = _state(request)
    raw = await request_body(request)
    parsed = parse_request(raw, settings)
    if parsed.stream:
        stream = await unless_disconnected(request.receive, serving.stream_response(
            broker, _registry(request), store, parsed, settings, raw))
        return SSEResponse(stream, named=True, ids=stream.stream_id is not None)
    if parsed.background:
        return JSONResponse(await serving.start_background(broker, _registry(request), store, parsed, settings, raw))
    body = await unless_disconnected(request.receive, serving.create_response(broker, _registry(request), store,
                                                                              parsed, settings))
    return JSONResponse(body, headers=dropped_headers((body["usage"] or {}).get("dropped_tool_calls", 0)))


async def retrieve(request: Request) -> Response:
    """GET /v1/responses/{response_id}; with ?stream=true its events again, after `starting_after` (or the
    Last-Event-ID header), from any gateway (gateway/replies/resume.py)."""
    broker, store, settings = _state(request)
    if request.query_params.get("stream", "").lower() in ("true", "1"):
        after = resume.last_event_id(request)
        stream = await serving.reopen_stream(broker, store, request.path_params["response_id"], settings,
                                             after=after)
        return SSEResponse(stream, named=True, ids=True, after=after)
    record = await store.load(request.path_params["response_id"], _key_name())
    return JSONResponse(record.response)


async def input_items(request: Request) -> Response:
    """GET /v1/responses/{response_id}/input_items: the items the response read, as a cursor page."""
    _, store, _ = _state(request)
    rid = request.path_params["response_id"]
    record = await store.load(rid, _key_name())
    stored = [items.listed(item, rid, index) for index, item in enumerate(record.history)]
    return JSONResponse(items.page(stored, dict(request.query_params)))


async def delete(request: Request) -> Response:
    """DELETE /v1/responses/{response_id}"""
    _, store, _ = _state(request)
    rid = request.path_params["response_id"]
    await store.delete(rid, _key_name())
    return JSONResponse(bodies.deleted_body(rid))


async def cancel(request: Request) -> Response:
    """POST /v1/responses/{response_id}/cancel: stop a running (background, streamed or waited-for) response."""
    broker, store, _ = _state(request)
    return JSONResponse(await serving.cancel_response(broker, store, request.path_params["response_id"],
                                                      _key_name()))


ROUTES = [
    route
    for prefix in ("/v1", "")
    for route in (
        Route(f"{prefix}/responses", create, methods=["POST"]),
        Route(prefix + "/responses/{response_id}", retrieve, methods=["GET"]),
        Route(prefix + "/responses/{response_id}/input_items", input_items, methods=["GET"]),
        Route(prefix + "/responses/{response_id}", delete, methods=["DELETE"]),
        Route(prefix + "/responses/{response_id}/cancel", cancel, methods=["POST"]),
    )
]
