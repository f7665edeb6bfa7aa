"""The Ollama API's HTTP routes (mounted by gateway/app.py); each decodes, calls gateway/ollama/serving.py or
models.py, and maps the result to a JSON or NDJSON response. Errors take Ollama's shape on every /api/ path
(gateway/http/errors.py asks gateway/ollama/errors.py), API keys and rate limits apply as on /v1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.http.disconnect import unless_disconnected
from gateway.http.fields import boolean, parse_json_object
from gateway.http.sse import HEADERS, SSEResponse
from gateway.ollama import models, protocol, serving
from gateway.ollama import pull as pulling
from gateway.replies.request_body import registry_and_pool, request_body
from gateway.replies.tool_calls import dropped_headers
from shared.settings import Settings

MEDIA_TYPE = "application/x-ndjson"


async def _lines(stream: serving.ReplyStream) -> AsyncIterator[bytes]:
    """One compact JSON object per line; objects already waiting go out in one send."""
    pending: list[bytes] = []
    async for item in stream:
        pending.append(json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n")
        if not stream.buffered:
            yield b"".join(pending)
            pending = []
    if pending:
        yield b"".join(pending)


class NDJSONResponse(SSEResponse):
    """An application/x-ndjson stream with the SSE response's care: it watches for the client going away and always
    closes the stream (cancelling its jobs)."""

    def __init__(self, stream: serving.ReplyStream) -> None:
        self._chunks = stream
        StreamingResponse.__init__(self, _lines(stream), media_type=MEDIA_TYPE, headers=HEADERS)


def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _generation(request: Request, parsed: protocol.OllamaGeneration) -> Response:
    broker, (registry, pool) = request.app.state.broker, registry_and_pool(request)
    if parsed.request is None:
        return JSONResponse(await serving.load_only(registry, pool, parsed))
    if parsed.stream:
        stream = await unless_disconnected(request.receive,
                                           serving.stream_generation(broker, registry, parsed, _settings(request)))
        return NDJSONResponse(stream)
    body = await unless_disconnected(request.receive,
                                     serving.run_generation(broker, registry, parsed, _settings(request)))
    return JSONResponse(body, headers=dropped_headers(body.get("dropped_tool_calls", 0)))


async def chat(request: Request) -> Response:
    """POST /api/chat"""
    return await _generation(request, protocol.parse_chat_request(await request_body(request), _settings(request)))


async def generate(request: Request) -> Response:
    """POST /api/generate"""
    return await _generation(request, protocol.parse_generate_request(await request_body(request), _settings(request)))


async def _embedding(request: Request, *, legacy: bool) -> Response:
    parsed = protocol.parse_embed_request(await request_body(request), _settings(request), legacy=legacy)
    return JSONResponse(await unless_disconnected(
        request.receive, serving.run_embedding(request.app.state.broker, parsed, _settings(request))))


async def embed(request: Request) -> Response:
    """POST /api/embed"""
    return await _embedding(request, legacy=False)


async def embeddings(request: Request) -> Response:
    """POST /api/embeddings (Ollama's older, one-prompt embeddings route)."""
    return await _embedding(request, legacy=True)


async def tags(request: Request) -> Response:
    """GET /api/tags"""
    return JSONResponse(await models.tags(*registry_and_pool(request)))


async def running(request: Request) -> Response:
    """GET /api/ps"""
    return JSONResponse(await models.running(request.app.state.broker, *registry_and_pool(request),
                                             _settings(request)))


async def show(request: Request) -> Response:
    """POST /api/show"""
    body = await request_body(request)
    return JSONResponse(await models.show(*registry_and_pool(request), protocol.model_name(body)))


async def pull(request: Request) -> Response:
    """POST /api/pull: a model `llmfleet pull` or a node's catalogue knows, with Ollama's progress objects (the
    name is required: a pull never defaults to the model served)."""
    body = parse_json_object(await request.body())
    target = await pulling.resolve_target(registry_and_pool(request)[1], protocol.model_name(body))
    if not boolean(body, "stream", True):
        return JSONResponse(await unless_disconnected(request.receive, pulling.pull_to_end(target)))
    return StreamingResponse(_pull_lines(pulling.progress_lines(target)), media_type=MEDIA_TYPE, headers=HEADERS)


async def _pull_lines(items: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """One compact JSON object per line, each sent as it comes."""
    async for item in items:
        yield json.dumps(item, separators=(",", ":")).encode("utf-8") + b"\n"


async def version(_request: Request) -> Response:
    """GET /api/version"""
    return JSONResponse(models.version())


async def banner(_request: Request) -> Response:
    """GET / (and HEAD): what Ollama answers, which clients probe before they connect."""
    return PlainTextResponse("Ollama is running")


ROUTES = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/ps", running, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/pull", pull, methods=["POST"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/", banner, methods=["GET", "HEAD"]),
]
