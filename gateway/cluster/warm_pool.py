"""The gateway's view of the warm pool: the live node agents' catalogues, each model's pool status, the
last-use and keep-alive marks nodes read, and the admin commands (load / unload) they act on.

A request for a catalogued model that no live worker serves is admitted and queued like any other: its
queued job is the placement request (every node sees the model's queue depth; the one that wins the
model's load claim loads it), and the request waits on its job (streams get `: queued` and keep-alives).
A remembered load failure refuses it at once with that failure (503 model_load_failed).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.cluster.queue_view import QueueState
from gateway.cluster.registry import Registry
from gateway.http.redis_errors import redis_unavailable
from shared import warm_pool_commands as pool_wire
from shared.errors import ModelLoadFailed
from shared.redis_commands import run_async
from shared.settings import Settings
from shared.warm_pool import FAILED, LOADING, READY, UNLOADED, NodeState

NODES_CACHE_S = 1.0
NOTE_USE_EVERY_S = 1.0  # a model's last-use mark is written at most this often by one gateway


@dataclass(frozen=True)
class ModelStatus:
    """One model as the admin API shows it."""

    model: str
    status: str  # loading / ready / failed / unloaded
    catalogued: bool
    replicas: int = 0
    loading: int = 0
    memory_bytes: int = 0
    last_used: float | None = None
    in_flight: int = 0  # requests taken by its workers and not finished (or sequences they report, if more)
    queued: int = 0  # requests waiting for a worker (or for the load)
    nodes: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        """The admin API's object for this model."""
        return {"id": self.model, "object": "pool.model", "status": self.status, "catalogued": self.catalogued,
                "replicas": self.replicas, "loading": self.loading, "memory_bytes": self.memory_bytes,
                "last_used": self.last_used, "in_flight": self.in_flight, "queued": self.queued,
                "nodes": list(self.nodes), "error": self.error}


class WarmPool:
    """Reads node agents' states (cached for a second) and writes the marks and commands they act on."""

    def __init__(self, redis: Redis, settings: Settings, registry: Registry, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._settings = settings
        self._registry = registry
        self._clock = clock
        self._nodes: list[NodeState] = []
        self._read_at: float | None = None
        self._noted: dict[str, float] = {}  # model -> when this gateway last marked it used

    async def nodes(self) -> list[NodeState]:
        """Every live node agent (cached for NODES_CACHE_S)."""
        now = self._clock()
        if self._read_at is not None and now - self._read_at < NODES_CACHE_S:
            return self._nodes
        with redis_unavailable(self._settings.retry_after_s):
            self._nodes = await run_async(self._redis, pool_wire.live_nodes(now))
        self._read_at = now
        return self._nodes

    async def catalogue(self) -> set[str]:
        """Every model some live node may load."""
        return {model for node in await self.nodes() for model in node.catalogue}

    async def note_use(self, model: str, keep_alive: float | None = None) -> None:
        """Mark `model` used now (the nodes' LRU order and keep-alive), with the request's keep_alive if it has one;
        without one, at most every NOTE_USE_EVERY_S per model (a burst writes it once, not per request)."""
        now = self._clock()
        if keep_alive is None and now - self._noted.get(model, float("-inf")) < NOTE_USE_EVERY_S:
            return
        self._noted[model] = now
        with redis_unavailable(self._settings.retry_after_s):
            pipe = self._redis.pipeline(transaction=False)
            pool_wire.queue_use(pipe, model, self._clock(), keep_alive)
            await pipe.execute()

    async def keep_alives(self) -> dict[str, float]:
        """Each model's keep-alive (seconds, -1 = forever) as its latest request that named one set it."""
        with redis_unavailable(self._settings.retry_after_s):
            return await run_async(self._redis, pool_wire.keep_alives())

    async def check_failure(self, model: str) -> None:
        """Raise the remembered load failure of `model` (503 model_load_failed, Retry-After its remaining time)."""
        with redis_unavailable(self._settings.retry_after_s):
            failure = await run_async(self._redis, pool_wire.failure_with_ttl(model))
        if failure is not None:
            raise ModelLoadFailed(failure[0], retry_after=failure[1])

    async def remembered_failure(self, model: str) -> str | None:
        """The remembered load failure of `model`, if any."""
        with redis_unavailable(self._settings.retry_after_s):
            return await run_async(self._redis, pool_wire.remembered_failure(model))

    async def command(self, op: str, model: str, *, force: bool = False) -> None:
        """Queue an admin command (load / unload) for the node agents; a load forgets a remembered failure."""
        with redis_unavailable(self._settings.retry_after_s):
            await run_async(self._redis, pool_wire.send_command(op, model, force=force))

    async def statuses(self, queue_state: Callable[[str], Awaitable[QueueState]]) -> list[ModelStatus]:
        """Every catalogued or served model's pool status; `queue_state(model)` is the broker's (waiting, taken
        but not finished, placed per worker)."""
        self._read_at = None  # the admin API reads fresh
        nodes = await self.nodes()
        live = await self._registry.live_models()
        catalogued = {model for node in nodes for model in node.catalogue}
        models = sorted(catalogued | set(live))
        with redis_unavailable(self._settings.retry_after_s):
            marks = await run_async(self._redis, pool_wire.failures_and_uses(models))
        statuses = []
        for model, (failed, used) in zip(models, marks, strict=True):
            slots = [(node.node_id, node.models[model]) for node in nodes if model in node.models]
            workers = live.get(model, [])
            loading = sum(1 for _, slot in slots if slot.state == LOADING)
            status = READY if workers else FAILED if failed else LOADING if loading else UNLOADED
            last = max([used or 0.0, *(slot.last_used for _, slot in slots)]) or None
            state = await queue_state(model)
            waiting, taken = state.waiting, state.in_flight
            statuses.append(ModelStatus(
                model=model, status=status, catalogued=model in catalogued, replicas=len(workers), loading=loading,
                memory_bytes=sum(slot.memory for _, slot in slots), last_used=last,
                in_flight=max(taken, sum(w.load for w in workers)), queued=waiting,
                nodes=tuple(node_id for node_id, _ in slots),
                error=failed.decode(errors="replace") if failed and not workers else None))
        return statuses
