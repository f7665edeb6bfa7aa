"""Anthropic's Messages routes: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.anthropic import protocol, serving
from gateway.http.disconnect import unless_disconnected
from gateway.http.request_body import app_state, request_body
from gateway.http.sse import SSEResponse
from gateway.replies.tool_calls import dropped_headers


async def messages(request: Request) -> Response:
    """POST /v1/messages (Anthropic's Messages API)."""
    broker, settings = app_state(request)
    parsed = protocol.parse_messages(await request_body(request), settings)
    if parsed.params.stream:
        stream = await unless_disconnected(request.receive, serving.stream_message(broker, parsed, settings))
        return SSEResponse(stream, named=True)
    body = await unless_disconnected(request.receive, serving.create_message(broker, parsed, settings))
    return JSONResponse(body, headers=dropped_headers(body["usage"].get("dropped_tool_calls", 0)))


async def count_tokens(request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's token count, as the model's worker tokenizes it."""
    broker, settings = app_state(request)
    parsed = protocol.parse_messages(await request_body(request), settings, count_only=True)
    return JSONResponse(await unless_disconnected(request.receive, serving.count_tokens(broker, parsed, settings)))


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
