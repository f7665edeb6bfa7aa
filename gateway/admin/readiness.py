"""Readiness: whether the deployment can serve every model it was started with (`/ready`), and whether this
gateway alone can take requests (`/ready/gateway`); `/health` (gateway/admin/router.py) is the process alone.

The deployment's required models are the ones live node agents were started to serve (`serve` without --lazy,
`node --eager`: their `pinned` list) plus LLMFLEET_REQUIRED_MODELS. Each is ready when a live worker of it is
registered, which a worker does only after its model is loaded and its kernels ran once (worker/serve/runner.py).
With no required model (a lazy pool, or workers that register on their own) the deployment is ready when Redis
answers and a worker or a node agent is alive: lazily loaded models are admitted while they load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.cluster.broker import Broker
from gateway.cluster.registry import RECHECK_S, Registry
from gateway.cluster.served_models import required_models
from gateway.cluster.warm_pool import WarmPool
from shared.errors import LLMFleetError
from shared.warm_pool import LOADING

READY = "ready"
NO_WORKER = "no worker"
FAILED = "failed"


@dataclass
class Readiness:
    """What /ready answers: the verdict, and each required model's state."""

    redis: bool
    workers: int = 0
    nodes: int = 0
    models: dict[str, str] = field(default_factory=dict)  # required model -> ready / loading / no worker / failed

    @property
    def ready(self) -> bool:
        """Every required model has a live worker (or, with none required, something can serve at all)."""
        if not self.redis:
            return False
        if self.models:
            return all(state == READY for state in self.models.values())
        return bool(self.workers or self.nodes)

    def to_json(self) -> dict[str, object]:
        """The /ready body; `waiting_for` names each model that cannot take a request yet, and why."""
        body: dict[str, object] = {"ready": self.ready, "redis": self.redis, "workers": self.workers}
        if self.nodes:
            body["nodes"] = self.nodes
        if self.models:
            body["models"] = dict(self.models)
            waiting = [f"{model} ({state})" for model, state in sorted(self.models.items()) if state != READY]
            if waiting:
                body["waiting_for"] = waiting
        elif self.redis and not self.ready:
            body["waiting_for"] = ["a worker (none is registered)"]
        return body


async def assess(broker: Broker, registry: Registry, pool: WarmPool) -> Readiness:
    """Read the registry, the node agents and remembered load failures once; Redis away is not ready."""
    if not await broker.ping():
        return Readiness(redis=False)
    try:
        live = await registry.live_models(RECHECK_S)  # a worker that just registered counts at once
        nodes = await pool.nodes()
        required = required_models(broker.settings, {m for node in nodes for m in node.pinned})
        states: dict[str, str] = {}
        for model in sorted(required):
            if model in live:
                states[model] = READY
            elif await pool.remembered_failure(model) is not None:
                states[model] = FAILED
            elif any(node.models.get(model) and node.models[model].state == LOADING for node in nodes):
                states[model] = LOADING
            else:
                states[model] = NO_WORKER
    except LLMFleetError:  # Redis went away between the ping and the reads
        return Readiness(redis=False)
    return Readiness(redis=True, workers=sum(len(w) for w in live.values()), nodes=len(nodes), models=states)
