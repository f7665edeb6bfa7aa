"""llama-server's extra routes: /tokenize, /detokenize and /apply-template."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.http.disconnect import unless_disconnected
from gateway.llamacpp import tokenization
from gateway.replies.request_body import app_state, request_body


def _tokenizer_route(operation: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        broker, settings = app_state(request)
        body = await request_body(request)
        return JSONResponse(await unless_disconnected(request.receive,
                                                      tokenization.answer(broker, settings, operation, body)))

    endpoint.__doc__ = f"POST /{operation.replace('_', '-')} (llama-server's)"
    return endpoint


ROUTES = [Route(f"/{operation.replace('_', '-')}", _tokenizer_route(operation), methods=["POST"])
          for operation in tokenization.BUILDERS]
