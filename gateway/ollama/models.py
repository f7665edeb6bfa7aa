"""Ollama's model routes' bodies: /api/tags (every model the fleet serves or may load), /api/ps (the loaded ones),
/api/show (one model) and /api/version; no Starlette here.

The gateway never reads model files, so what Ollama reads from a GGUF is what the workers publish: the context
length (a worker's `context_length` statistic) and, for pooled models, the memory the node agents report. Model
names are llmfleet's ids (an Ollama client's "name:latest" means the same model); details say format "gguf" and
leave family, parameter size and quantization empty; digests are the SHA-256 of the name, stable but not a file's.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from gateway.cluster.broker import Broker
from gateway.ollama.protocol import served_name
from shared.errors import ModelNotFound
from shared.settings import Settings
from shared.warm_pool import READY

VERSION = "0.12.0"  # the Ollama API level llmfleet answers for (what /api/version reports)
FOREVER = datetime(2318, 1, 1, tzinfo=UTC)  # Ollama's expires_at of a model kept loaded forever
CAPABILITIES = ["completion", "tools"]


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat().replace("+00:00", "Z")


def digest(model: str) -> str:
    """A stable digest for a model name (llmfleet has no Ollama blobs to hash)."""
    return hashlib.sha256(model.encode()).hexdigest()


def details() -> dict[str, Any]:
    """Ollama's details object, with what the gateway knows of a model."""
    return {"parent_model": "", "format": "gguf", "family": "", "families": None, "parameter_size": "",
            "quantization_level": ""}


async def context_length(broker: Broker, model: str) -> int | None:
    """The model's context length as its live workers publish it (the smallest), None while none does."""
    workers = (await broker.registry.live_models()).get(model, [])
    lengths = [int(w.stats["context_length"]) for w in workers if w.stats.get("context_length")]
    return min(lengths) if lengths else None


async def tags(broker: Broker) -> dict[str, Any]:
    """/api/tags: the models with a live worker or in a live node agent's catalogue."""
    live, catalogue = await broker.registry.live_models(), await broker.pool.catalogue()
    now = time.time()
    models = []
    for model in sorted(set(live) | catalogue):
        modified = min(w.started for w in live[model]) if model in live else now
        models.append({"name": model, "model": model, "modified_at": _iso(modified), "size": 0,
                       "digest": digest(model), "details": details()})
    return {"models": models}


async def running(broker: Broker, settings: Settings) -> dict[str, Any]:
    """/api/ps: the models a live worker serves, with the memory and keep-alive the warm pool knows of."""
    live = await broker.registry.live_models()
    pooled = {s.model: s for s in await broker.pool.statuses(broker.queue_state) if s.status == READY}
    keep_alive = await broker.pool.keep_alives()
    models = []
    for model in sorted(live):
        status = pooled.get(model)
        expires = FOREVER.isoformat().replace("+00:00", "Z")
        if status is not None and status.catalogued:  # a node agent unloads it once idle for its keep-alive
            keep = keep_alive.get(model, settings.pool_keep_alive_s)
            if keep >= 0:
                expires = _iso((status.last_used or time.time()) + keep)
        memory = status.memory_bytes if status is not None else 0
        models.append({"name": model, "model": model, "size": memory, "digest": digest(model),
                       "details": details(), "expires_at": expires, "size_vram": 0,
                       "context_length": await context_length(broker, model)})
    return {"models": models}


async def show(broker: Broker, name: str) -> dict[str, Any]:
    """/api/show: one model's details and model_info (its context length once a worker published it)."""
    model = served_name(name)
    live = await broker.registry.live_models()
    if model not in live and model not in await broker.pool.catalogue() and not await broker.registry.is_known(model):
        raise ModelNotFound(f"model '{name}' not found", param="model")
    info: dict[str, Any] = {"general.architecture": "llmfleet"}
    context = await context_length(broker, model)
    if context is not None:
        info["llmfleet.context_length"] = context
    started = min((w.started for w in live.get(model, [])), default=time.time())
    return {"modelfile": "", "parameters": "", "template": "", "details": details(), "model_info": info,
            "capabilities": CAPABILITIES, "modified_at": _iso(started)}


def version() -> dict[str, str]:
    """/api/version."""
    return {"version": VERSION}
