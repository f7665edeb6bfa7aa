"""Ollama's model routes' bodies: /api/tags (every model the fleet serves or may load), /api/ps (the loaded ones),
/api/show (one model) and /api/version; no Starlette here.

The gateway never reads model files, so what Ollama reads from a GGUF is what the workers publish: the model
file's facts (size in bytes, SHA-256 digest, details: family, parameter_size, quantization_level, and the
model_info keys; worker/model_facts.py, in the `llmfleet:model-facts` hash), the context length (a worker's
`context_length` statistic) and, for pooled models, the memory the node agents report. Model names are llmfleet's
ids (an Ollama client's "name:latest" means the same model). A model whose facts are not published yet (its
worker is still hashing the file, or none ever ran since Redis started empty) has size 0, empty details and the
SHA-256 of its name as digest.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.cluster.warm_pool import WarmPool
from gateway.ollama.protocol import served_name
from shared.errors import ModelNotFound
from shared.settings import Settings
from shared.warm_pool import READY

VERSION = "0.12.0"  # the Ollama API level llmfleet answers for (what /api/version reports)
FOREVER = datetime(2318, 1, 1, tzinfo=UTC)  # Ollama's expires_at of a model kept loaded forever
CAPABILITIES = ["completion", "tools"]


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat().replace("+00:00", "Z")


def digest(model: str, facts: dict[str, Any] | None = None) -> str:
    """The model file's SHA-256 as its worker published it; until then a stable digest of the name."""
    if facts and isinstance(facts.get("digest"), str):
        return facts["digest"]
    return hashlib.sha256(model.encode()).hexdigest()


def details(facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ollama's details object, from the model file's published facts (empty fields until then)."""
    facts = facts or {}
    family = str(facts.get("family", ""))
    return {"parent_model": "", "format": facts.get("format", "gguf"), "family": family,
            "families": [family] if family else None, "parameter_size": str(facts.get("parameter_size", "")),
            "quantization_level": str(facts.get("quantization_level", ""))}


async def context_length(registry: Registry, model: str) -> int | None:
    """The model's context length as its live workers publish it (the smallest), None while none does."""
    workers = (await registry.live_models()).get(model, [])
    lengths = [int(w.stats["context_length"]) for w in workers if w.stats.get("context_length")]
    return min(lengths) if lengths else None


async def tags(registry: Registry, pool: WarmPool) -> dict[str, Any]:
    """/api/tags: the models with a live worker or in a live node agent's catalogue."""
    live, catalogue = await registry.live_models(), await pool.catalogue()
    facts = await registry.model_facts()
    now = time.time()
    models = []
    for model in sorted(set(live) | catalogue):
        modified = min(w.started for w in live[model]) if model in live else now
        known = facts.get(model)
        models.append({"name": model, "model": model, "modified_at": _iso(modified),
                       "size": int((known or {}).get("size", 0)), "digest": digest(model, known),
                       "details": details(known)})
    return {"models": models}


async def running(broker: Broker, registry: Registry, pool: WarmPool, settings: Settings) -> dict[str, Any]:
    """/api/ps: the models a live worker serves, with the memory and keep-alive the warm pool knows of (the
    broker reads each model's queue)."""
    live = await registry.live_models()
    facts = await registry.model_facts()
    pooled = {s.model: s for s in await pool.statuses(broker.queue_state) if s.status == READY}
    keep_alive = await pool.keep_alives()
    models = []
    for model in sorted(live):
        status = pooled.get(model)
        expires = FOREVER.isoformat().replace("+00:00", "Z")
        if status is not None and status.catalogued:  # a node agent unloads it once idle for its keep-alive
            keep = keep_alive.get(model, settings.pool_keep_alive_s)
            if keep >= 0:
                expires = _iso((status.last_used or time.time()) + keep)
        memory = status.memory_bytes if status is not None else 0
        models.append({"name": model, "model": model, "size": memory, "digest": digest(model, facts.get(model)),
                       "details": details(facts.get(model)), "expires_at": expires, "size_vram": 0,
                       "context_length": await context_length(registry, model)})
    return {"models": models}


async def show(registry: Registry, pool: WarmPool, name: str) -> dict[str, Any]:
    """/api/show: one model's details and model_info (its context length once a worker published it)."""
    model = served_name(name)
    live = await registry.live_models()
    if model not in live and model not in await pool.catalogue() and not await registry.is_known(model):
        raise ModelNotFound(f"model '{name}' not found", param="model")
    known = (await registry.model_facts()).get(model)
    info: dict[str, Any] = dict(known.get("model_info", {})) if known else {"general.architecture": "llmfleet"}
    context = await context_length(registry, model)
    if context is not None:  # what the worker serves (the file's own may be larger)
        info[f"{info.get('general.architecture', 'llmfleet')}.context_length"] = context
    started = min((w.started for w in live.get(model, [])), default=time.time())
    return {"modelfile": "", "parameters": "", "template": "", "details": details(known), "model_info": info,
            "capabilities": list(known.get("capabilities", CAPABILITIES)) if known else CAPABILITIES,
            "modified_at": _iso(started)}


def version() -> dict[str, str]:
    """/api/version."""
    return {"version": VERSION}
