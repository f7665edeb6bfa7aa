"""The JSON object body every API's router reads first, with the request's `model` resolved against what is served."""

from __future__ import annotations

from starlette.requests import Request

from gateway.cluster.broker import Broker
from gateway.cluster.loras import split_model
from gateway.cluster.registry import Registry
from gateway.cluster.served_models import default_models
from gateway.cluster.warm_pool import WarmPool
from gateway.http.error_log import note_request
from gateway.http.fields import parse_json_object
from shared.errors import InvalidRequest
from shared.settings import Settings


def app_state(request: Request) -> tuple[Broker, Settings]:
    """The app's broker and settings."""
    return request.app.state.broker, request.app.state.settings


def registry_and_pool(request: Request) -> tuple[Registry, WarmPool]:
    """The app's worker registry and warm pool, built at startup (gateway/app.py) and read here, not through
    the broker."""
    return request.app.state.registry, request.app.state.pool


async def request_body(request: Request) -> dict:
    """The JSON object body; a missing (or null) `model` is the one model served when there is exactly one (as
    llama-server does), else a 400 naming `model`. With LLMFLEET_ANY_MODEL_NAME=1 and one model served, any
    name is that model (llama-server ignores the name; clients hard-code "gpt-3.5-turbo")."""
    note = note_request()
    body = parse_json_object(await request.body())
    model = body.get("model")
    if isinstance(model, str):
        note.model = model
    if model is None:
        served = await default_models(*registry_and_pool(request), request.app.state.settings)
        if len(served) != 1:
            raise InvalidRequest(f"Missing required parameter: 'model' ({len(served)} models are served: "
                                 f"{', '.join(served) or 'none'}).", param="model")
        body["model"] = note.model = served[0]
    elif isinstance(model, str) and request.app.state.settings.any_model_name:
        live = sorted(await registry_and_pool(request)[0].live_models())
        base, adapter = split_model(model)
        if len(live) == 1 and base not in live and model not in live:
            body["model"] = note.model = live[0] if adapter is None else f"{live[0]}:{adapter}"
    return body
