"""Anthropic's Messages routes: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.anthropic import protocol, serving
from gateway.http.disconnect import unless_disconnected
from gateway.http.sse import SSEResponse
from gateway.replies import resume
from gateway.replies.request_body import app_state, registry_and_pool, request_body
from gateway.replies.tool_calls import dropped_headers


async def messages(request: Request) -> Response:
    """POST /v1/messages (Anthropic's Messages API)."""
    broker, settings = app_state(request)
    raw = await request_body(request)
    registry, _pool = registry_and_pool(request)
    parsed = protocol.parse_messages(raw, settings)
    if parsed.params.stream:
        stream = await unless_disconnected(request.receive,
                                           serving.stream_message(broker, registry, parsed, settings, raw))
        return SSEResponse(stream, named=True, ids=stream.stream_id is not None)
    body = await unless_disconnected(request.receive, serving.create_message(broker, registry, parsed, settings))
    return JSONResponse(body, headers=dropped_headers(body["usage"].get("dropped_tool_calls", 0)))


async def count_tokens(request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's token count, as the model's worker tokenizes it."""
    broker, settings = app_state(request)
    parsed = protocol.parse_messages(await request_body(request), settings, count_only=True)
    return JSONResponse(await unless_disconnected(request.receive, serving.count_tokens(broker, parsed, settings)))


async def resume_message(request: Request) -> Response:
    """GET /v1/messages/{message_id}/stream: the rest of a streamed message after its `Last-Event-ID`, from any
    gateway (gateway/replies/resume.py)."""
    broker, settings = app_state(request)
    after = resume.last_event_id(request)
    record = await resume.reopen(broker, request.path_params["message_id"], ("anthropic",), after)
    parsed = protocol.parse_messages(record.body, settings)
    request_events = await resume.follow(broker, record, 1)
    stream = serving.message_stream(broker, parsed, settings, request_events, record.request_id, record.reply_format)
    stream.resumable(broker.streams, record.stream_id)
    return SSEResponse(stream, named=True, ids=True, after=after)


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/v1/messages/{message_id}/stream", resume_message, methods=["GET"]),
]
