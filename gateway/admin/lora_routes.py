"""`/admin/loras`: load, list and unload LoRA adapters at runtime, for every worker of a base model.

POST writes the adapter into the model's desired set (`llmfleet:{model}:loras`, durable in Redis, so a worker
that starts later or after a crash loads it too), then waits up to LORA_LOAD_WAIT_S until every live worker
of the model reports it loaded (201), or one reports a load error (400 `lora_load_failed`, the engine's
message naming the file and tensor); past the wait it answers 202 with the workers that have it so far.
DELETE takes it out of the set: new requests naming it get a 404 at once, running ones finish with it.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cluster.lora_set import LoraSet
from gateway.cluster.loras import ADAPTER_NAME, adapters_of
from gateway.cluster.registry import Registry
from gateway.http.fields import invalid, parse_json_object, string
from gateway.replies.request_body import registry_and_pool
from shared.errors import LoraLimitReached, LoraLoadFailed, LoraNotFound, ModelNotFound
from shared.registry import RegistryEntry
from shared.settings import Settings

LORA_LOAD_WAIT_S = 30.0
POLL_S = 0.2
MAX_SOURCE = 4096


def _loras(request: Request) -> LoraSet:
    """The app's desired-adapter sets (built at startup: gateway/app.py)."""
    return request.app.state.loras


async def _live_workers_of(registry: Registry, model: str) -> list[RegistryEntry]:
    """The model's live workers, read fresh (not the admission cache); 404 when it has none."""
    workers = [w for w in await registry.reporting_workers() if w.model == model and w.state == "ready"]
    if not workers:
        raise ModelNotFound(f"The model '{model}' has no live worker", param="model")
    return workers


async def load_lora(request: Request) -> Response:
    """POST /admin/loras {"model", "name", "path" (a .gguf on the workers' disk, or hf:owner/repo/file.gguf)}"""
    settings: Settings = request.app.state.settings
    registry, loras = registry_and_pool(request)[0], _loras(request)
    body = parse_json_object(await request.body())
    model = string(body, "model", max_len=256)
    name = string(body, "name", max_len=64)
    if not ADAPTER_NAME.match(name):
        raise invalid("name", "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.")
    source = body.get("path", body.get("source"))
    if not isinstance(source, str) or not source.strip() or len(source) > MAX_SOURCE:
        raise invalid("path", "expected the adapter's .gguf path on the workers, or hf:owner/repo/file.gguf.")
    await _live_workers_of(registry, model)
    desired, limit = await loras.names(model), settings.max_loras
    if len(desired) >= limit and name.encode() not in desired:
        raise LoraLimitReached(f"model '{model}' already has {len(desired)} LoRA adapters (LLMFLEET_MAX_LORAS="
                               f"{limit}); DELETE one first")
    version = await loras.add(model, name, source)
    deadline = time.monotonic() + LORA_LOAD_WAIT_S
    while True:
        await asyncio.sleep(POLL_S)
        error = await loras.load_error(model, name)
        if error is not None:
            raise LoraLoadFailed(error, param="path")
        workers = await _live_workers_of(registry, model)
        # only workers that followed our write count: one still showing the state before it (a DELETE of the same
        # name it has not followed yet) would drop the adapter a moment after this answer said it was loaded
        loaded = sorted(w.worker_id for w in workers if w.loras_version >= version and name in w.loras)
        if len(loaded) == len(workers) or time.monotonic() > deadline:
            status = 201 if len(loaded) == len(workers) else 202
            return JSONResponse({"object": "lora", "model": model, "name": name, "id": f"{model}:{name}",
                                 "source": source, "loaded_by": loaded, "workers": len(workers)}, status_code=status)


async def list_loras(request: Request) -> Response:
    """GET /admin/loras[?model=]: every model's desired adapters and which live workers hold them."""
    registry, loras = registry_and_pool(request)[0], _loras(request)
    live = await registry.live_models()
    wanted = request.query_params.get("model")
    models = sorted({wanted} if wanted else set(live) | set(await registry.known_models()))
    data = []
    for model in models:
        sources = await loras.sources(model)
        workers = live.get(model, [])
        for name in sorted(set(sources) | set(adapters_of(model, workers))):
            data.append({"object": "lora", "model": model, "name": name, "id": f"{model}:{name}",
                         "source": sources.get(name), "loaded_by": sorted(w.worker_id for w in workers if name in w.loras),
                         "desired": name in sources})
    return JSONResponse({"object": "list", "data": data})


async def delete_lora(request: Request) -> Response:
    """DELETE /admin/loras/{model}/{name}: unload it everywhere (requests running with it finish with it)."""
    model, name = request.path_params["model"], request.path_params["name"]
    if not await _loras(request).remove(model, name):
        raise LoraNotFound(f"The LoRA adapter '{name}' is not loaded for model '{model}'", param="name")
    return JSONResponse({"object": "lora", "model": model, "name": name, "deleted": True})


ROUTES = [
    Route("/admin/loras", load_lora, methods=["POST"]),
    Route("/admin/loras", list_loras, methods=["GET"]),
    Route("/admin/loras/{model:path}/{name}", delete_lora, methods=["DELETE"]),
]
