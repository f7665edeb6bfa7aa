"""OpenAI's routes (under /v1 and, as llama-server serves them, without it); each one decodes, calls serving,
and maps the result to a response."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cluster.registry import Registry
from gateway.cluster.warm_pool import WarmPool
from gateway.http.disconnect import unless_disconnected
from gateway.http.sse import SSEResponse
from gateway.replies import bodies, protocol, resume, serving
from gateway.replies.protocol import ChatRequest, CompletionRequest
from gateway.replies.request_body import app_state, registry_and_pool, request_body
from gateway.replies.tool_calls import dropped_headers
from shared.errors import ModelNotFound


async def _generate(request: Request, parsed: ChatRequest | CompletionRequest, raw: dict[str, Any]) -> Response:
    broker, settings = app_state(request)
    registry, _pool = registry_and_pool(request)
    if parsed.params.stream:
        stream = await unless_disconnected(request.receive,
                                           serving.stream_completion(broker, registry, parsed, settings, raw))
        return SSEResponse(stream, ids=stream.stream_id is not None)
    body = await unless_disconnected(request.receive, serving.run_completion(broker, registry, parsed, settings))
    return JSONResponse(body, headers=dropped_headers(body["usage"].get("dropped_tool_calls", 0)))


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions"""
    raw = await request_body(request)
    return await _generate(request, protocol.parse_chat(raw, request.app.state.settings), raw)


async def completions(request: Request) -> Response:
    """POST /v1/completions"""
    raw = await request_body(request)
    return await _generate(request, protocol.parse_completion(raw, request.app.state.settings), raw)


async def resume_stream(request: Request) -> Response:
    """GET /v1/chat/completions/{stream_id}/stream and /v1/completions/{stream_id}/stream: the rest of a stream
    after its `Last-Event-ID` (gateway/replies/resume.py), from any gateway."""
    broker, settings = app_state(request)
    chat = "/chat/completions/" in request.url.path
    after = resume.last_event_id(request)
    record = await resume.reopen(broker, request.path_params["stream_id"], ("chat",) if chat else ("completion",),
                                 after)
    parse = protocol.parse_chat if chat else protocol.parse_completion
    parsed = parse(record.body, settings)
    request_events = await resume.follow(broker, record, parsed.params.n)
    stream = serving.chunk_stream(broker, parsed, settings, request_events, record.request_id, record.created,
                                  record.reply_format)
    stream.resumable(broker.streams, record.stream_id)
    return SSEResponse(stream, ids=True, after=after)


async def embeddings(request: Request) -> Response:
    """POST /v1/embeddings"""
    broker, settings = app_state(request)
    parsed = protocol.parse_embeddings(await request_body(request), settings)
    body = await unless_disconnected(request.receive, serving.run_embeddings(broker, parsed, settings))
    return JSONResponse(body)


async def _model_objects(registry: Registry, pool: WarmPool) -> dict[str, dict]:
    """Every model a live worker serves or a live node may load, with whether it is loaded."""
    live = await registry.live_models()
    catalogue = await pool.catalogue()
    now = int(time.time())
    objects = {m: bodies.model_object(m, int(min(w.started for w in live[m])) if m in live else now,
                                      loaded=m in live) for m in sorted(set(live) | catalogue)}
    return objects


async def list_models(request: Request) -> Response:
    """GET /v1/models: the models that have a live worker or are in a live node agent's catalogue (each with
    whether it is loaded), then the live ones' LoRA adapters (`<base>:<adapter>`)."""
    registry, pool = registry_and_pool(request)
    data = list((await _model_objects(registry, pool)).values())
    data += bodies.adapter_objects(await registry.live_models())
    return JSONResponse(bodies.model_list(data))


async def get_model(request: Request) -> Response:
    """GET /v1/models/{model}"""
    model = request.path_params["model"]
    registry, pool = registry_and_pool(request)
    found = (await _model_objects(registry, pool)).get(model)
    if found is None:
        found = next((a for a in bodies.adapter_objects(await registry.live_models())
                      if a["id"] == model), None)
    if found is None:
        raise ModelNotFound(f"The model '{model}' does not exist", param="model")
    return JSONResponse(found)


OPENAI_ROUTES = [  # served under /v1 and, as llama-server does, without the prefix
    ("/chat/completions", chat_completions, "POST"),
    ("/chat/completions/{stream_id}/stream", resume_stream, "GET"),
    ("/completions", completions, "POST"),
    ("/completions/{stream_id}/stream", resume_stream, "GET"),
    ("/embeddings", embeddings, "POST"),
    ("/models", list_models, "GET"),
    ("/models/{model:path}", get_model, "GET"),
]
ROUTES = [
    *(Route(prefix + path, endpoint, methods=[method]) for prefix in ("/v1", "") for path, endpoint, method
      in OPENAI_ROUTES),
]
