"""HTTP routes; each one decodes, calls serving, and maps the result to a response."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway import (
    admin_routes,
    anthropic,
    anthropic_messages,
    dashboard,
    lora_routes,
    protocol,
    readiness,
    responses,
    serving,
    tokenization,
)
from gateway.batch_routes import BATCH_ROUTES
from gateway.broker import Broker
from gateway.checks import parse_json_object
from gateway.disconnect import unless_disconnected
from gateway.error_log import note_request
from gateway.loras import split_model
from gateway.metrics import CONTENT_TYPE, FleetSnapshot
from gateway.openapi import openapi_document
from gateway.pool import requested_keep_alive
from gateway.protocol import ChatRequest, CompletionRequest
from gateway.sse import SSEResponse
from shared.errors import InvalidRequest, LLMFleetError, ModelNotFound
from shared.settings import Settings
from shared.warm_pool import parse_keep_alive


def _state(request: Request) -> tuple[Broker, Settings]:
    return request.app.state.broker, request.app.state.settings


async def _generate(request: Request, parsed: ChatRequest | CompletionRequest) -> Response:
    broker, settings = _state(request)
    if parsed.params.stream:
        stream = await unless_disconnected(request.receive, serving.stream_completion(broker, parsed, settings))
        return SSEResponse(stream)
    body = await unless_disconnected(request.receive, serving.run_completion(broker, parsed, settings))
    return JSONResponse(body)


async def request_body(request: Request) -> dict:
    """The JSON object body; a missing (or null) `model` is the one model served when there is exactly one (as
    llama-server does), else a 400 naming `model`. With LLMFLEET_ANY_MODEL_NAME=1 and one model served, any
    name is that model (llama-server ignores the name; clients hard-code "gpt-3.5-turbo")."""
    note = note_request()
    body = parse_json_object(await request.body())
    try:  # Ollama's keep_alive: how long the model stays loaded after this request (the warm pool reads it)
        requested_keep_alive.set(parse_keep_alive(body.pop("keep_alive", None)))
    except ValueError as exc:
        raise InvalidRequest(f"Invalid value for 'keep_alive': {exc}.", param="keep_alive") from None
    model = body.get("model")
    if isinstance(model, str):
        note.model = model
    if model is None:
        served = await readiness.default_models(request.app.state.broker)
        if len(served) != 1:
            raise InvalidRequest(f"Missing required parameter: 'model' ({len(served)} models are served: "
                                 f"{', '.join(served) or 'none'}).", param="model")
        body["model"] = note.model = served[0]
    elif isinstance(model, str) and request.app.state.settings.any_model_name:
        live = sorted(await request.app.state.broker.registry.live_models())
        base, adapter = split_model(model)
        if len(live) == 1 and base not in live and model not in live:
            body["model"] = note.model = live[0] if adapter is None else f"{live[0]}:{adapter}"
    return body


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions"""
    return await _generate(request, protocol.parse_chat(await request_body(request), request.app.state.settings))


async def completions(request: Request) -> Response:
    """POST /v1/completions"""
    return await _generate(request, protocol.parse_completion(await request_body(request), request.app.state.settings))


async def messages(request: Request) -> Response:
    """POST /v1/messages (Anthropic's Messages API)."""
    broker, settings = _state(request)
    parsed = anthropic.parse_messages(await request_body(request), settings)
    if parsed.params.stream:
        stream = await unless_disconnected(request.receive, anthropic_messages.stream_message(broker, parsed, settings))
        return SSEResponse(stream, named=True)
    body = await unless_disconnected(request.receive, anthropic_messages.create_message(broker, parsed, settings))
    return JSONResponse(body)


async def count_tokens(request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's token count, as the model's worker tokenizes it."""
    broker, settings = _state(request)
    parsed = anthropic.parse_messages(await request_body(request), settings, count_only=True)
    return JSONResponse(await unless_disconnected(request.receive, anthropic_messages.count_tokens(broker, parsed, settings)))


async def embeddings(request: Request) -> Response:
    """POST /v1/embeddings"""
    broker, settings = _state(request)
    parsed = protocol.parse_embeddings(await request_body(request), settings)
    body = await unless_disconnected(request.receive, serving.run_embeddings(broker, parsed, settings))
    return JSONResponse(body)


def _tokenizer_route(operation: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        broker, settings = _state(request)
        body = await request_body(request)
        return JSONResponse(await unless_disconnected(request.receive,
                                                      tokenization.answer(broker, settings, operation, body)))

    endpoint.__doc__ = f"POST /{operation.replace('_', '-')} (llama-server's)"
    return endpoint


async def _model_objects(broker: Broker) -> dict[str, dict]:
    """Every model a live worker serves or a live node may load, with whether it is loaded."""
    live = await broker.registry.live_models()
    catalogue = await broker.pool.catalogue()
    now = int(time.time())
    objects = {m: responses.model_object(m, int(min(w.started for w in live[m])) if m in live else now,
                                         loaded=m in live) for m in sorted(set(live) | catalogue)}
    return objects


async def list_models(request: Request) -> Response:
    """GET /v1/models: the models that have a live worker or are in a live node agent's catalogue (each with
    whether it is loaded), then the live ones' LoRA adapters (`<base>:<adapter>`)."""
    broker = request.app.state.broker
    data = list((await _model_objects(broker)).values())
    data += lora_routes.adapter_objects(await broker.registry.live_models())
    return JSONResponse(responses.model_list(data))


async def get_model(request: Request) -> Response:
    """GET /v1/models/{model}"""
    model = request.path_params["model"]
    broker = request.app.state.broker
    found = (await _model_objects(broker)).get(model)
    if found is None:
        found = next((a for a in lora_routes.adapter_objects(await broker.registry.live_models())
                      if a["id"] == model), None)
    if found is None:
        raise ModelNotFound(f"The model '{model}' does not exist", param="model")
    return JSONResponse(found)


async def metrics(request: Request) -> Response:
    """GET /metrics: Prometheus text of this gateway's requests and the whole fleet's workers and queues."""
    broker: Broker = request.app.state.broker
    try:
        snapshot = await broker.fleet_snapshot()
    except LLMFleetError:  # Redis away: still export this gateway's own numbers
        snapshot = FleetSnapshot()
    return Response(broker.metrics.render(snapshot), media_type=CONTENT_TYPE)


async def openapi_json(request: Request) -> Response:
    """GET /openapi.json: the gateway's OpenAPI document, with its configured limits."""
    return JSONResponse(openapi_document(request.app.state.settings))


async def health(_request: Request) -> Response:
    """GET /health: the process is up."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    """GET /ready: every model the deployment was started with has a live, loaded worker (503 naming the rest);
    with none required, Redis answers and a worker or node agent is alive. See gateway/readiness.py."""
    broker: Broker = request.app.state.broker
    verdict = await readiness.assess(broker)
    body = verdict.to_json()
    supervisor = await broker.supervisor_status() if verdict.redis else None
    if supervisor is not None:
        body["supervisor"] = supervisor
        body["degraded"] = bool(supervisor["workers_given_up"]) or \
            supervisor["workers_running"] < supervisor["workers_expected"]
    return JSONResponse(body, status_code=200 if verdict.ready else 503)


async def gateway_ready(request: Request) -> Response:
    """GET /ready/gateway: this gateway can take and queue requests (Redis answers), workers or not."""
    redis_ok = await request.app.state.broker.ping()
    return JSONResponse({"ready": redis_ok, "redis": redis_ok}, status_code=200 if redis_ok else 503)


OPENAI_ROUTES = [  # served under /v1 and, as llama-server does, without the prefix
    ("/chat/completions", chat_completions, "POST"),
    ("/completions", completions, "POST"),
    ("/embeddings", embeddings, "POST"),
    ("/models", list_models, "GET"),
    ("/models/{model:path}", get_model, "GET"),
    *BATCH_ROUTES,
]
ROUTES = [
    *(Route(prefix + path, endpoint, methods=[method]) for prefix in ("/v1", "") for path, endpoint, method
      in OPENAI_ROUTES),
    *(Route(f"/{operation.replace('_', '-')}", _tokenizer_route(operation), methods=["POST"])
      for operation in tokenization.BUILDERS),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    *lora_routes.ROUTES,
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/ready/gateway", gateway_ready, methods=["GET"]),
    *dashboard.ROUTES,
    *admin_routes.ROUTES,
]
