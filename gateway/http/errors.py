"""Every failure as an OpenAI-shaped JSON error response, Starlette's own 404/405 included, unless an API above
registered its own shape for its paths: app.py puts them on `app.state.error_shapes` (Anthropic's on the Messages
API's paths, gateway/anthropic/errors.py; Ollama's on /api/..., gateway/ollama/errors.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.http.api_keys import current_key
from gateway.http.error_log import make_entry
from shared.errors import InternalError, LLMFleetError, MethodNotAllowed, NotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ErrorShape:
    """An API's own error body, used on the paths it claims (registered by app.py on app.state.error_shapes)."""

    claims: Callable[[str], bool]  # the request's path -> whether this shape answers it
    body: Callable[[LLMFleetError], dict[str, Any]]


def _shapes(app_state: object) -> Sequence[ErrorShape]:
    return getattr(app_state, "error_shapes", ())


def record_error(app_state: object, error: LLMFleetError, path: str, *, streamed: bool = False,
                 key_name: str | None = None) -> None:
    """Add `error` to the fleet's recent errors (the dashboard's list); never raises."""
    errors = getattr(getattr(app_state, "broker", None), "errors", None)
    if errors is None:  # the app is not started (no broker yet)
        return
    key = current_key.get()
    errors.record(make_entry(status=error.status, type=error.type, code=error.code, param=error.param, path=path,
                             key=key_name or (key.name if key is not None else None), streamed=streamed))


def error_response(error: LLMFleetError, path: str = "", app_state: object = None) -> JSONResponse:
    """The JSON response for `error` on a request to `path`, with Retry-After where it has one: in the shape
    registered on `app_state` for the path, else OpenAI's."""
    shape = next((shape for shape in _shapes(app_state) if shape.claims(path)), None)
    body = error.to_openai() if shape is None else shape.body(error)
    return JSONResponse(body, status_code=error.status, headers=error.headers())


async def handle_llmfleet_error(request: Request, exc: Exception) -> Response:
    """LLMFleetError -> its status and body (and an entry in the recent errors)."""
    assert isinstance(exc, LLMFleetError)
    record_error(request.app.state, exc, request.url.path)
    return error_response(exc, request.url.path, request.app.state)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (unknown URL, wrong method) in OpenAI's shape (or the path's API's)."""
    assert isinstance(exc, HTTPException)
    where = f"({request.method} {request.url.path})"
    if exc.status_code == 404:
        return error_response(NotFound(f"Invalid URL {where}"), request.url.path, request.app.state)
    if exc.status_code == 405:
        response = error_response(MethodNotAllowed(f"Method not allowed {where}"), request.url.path,
                                  request.app.state)
        response.headers.update(exc.headers or {})
        return response
    error = LLMFleetError(str(exc.detail))
    error.status = exc.status_code
    error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return error_response(error, request.url.path, request.app.state)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """Anything else is a 500 whose message says nothing about the request's content."""
    log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path, exc_info=exc)
    error = InternalError("The server had an error while processing your request.")
    record_error(request.app.state, error, request.url.path)
    return error_response(error, request.url.path, request.app.state)
