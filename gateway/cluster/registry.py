"""The gateway's view of the worker registry: which workers are alive, which models are known.

A worker is live when all of these hold:
  - its id is in the sorted set llmfleet:workers with a score (last heartbeat) within the heartbeat TTL,
  - its hash llmfleet:worker:{id} exists (the worker sets EXPIRE = heartbeat TTL on every heartbeat),
  - the hash has model (non-empty), version == WIRE_VERSION and heartbeat (unix s) within the TTL,
  - its state field is absent or "ready" ("draining" workers finish what they have but take nothing new).
A model is known (503 when it has no live worker, rather than 404) while its score in the sorted set
llmfleet:models, refreshed by every heartbeat of a worker serving it, is within LLMFLEET_MODEL_MEMORY_S.
A model's file facts (size, digest, details: worker/model_facts.py) are what its workers published in the hash
llmfleet:model-facts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from gateway.http.redis_errors import redis_unavailable
from shared import keys
from shared.redis_commands import fresh_workers, run_async
from shared.registry import RegistryEntry
from shared.settings import Settings

log = logging.getLogger(__name__)

WorkerInfo = RegistryEntry  # one live worker's registry entry
RECHECK_S = 0.1  # a cached read this old is read again where a model has no live worker in it (admission) and for
# /ready: a worker that just registered is seen within this, not within the whole LLMFLEET_REGISTRY_CACHE_S


class Registry:
    """Reads live workers (cached for LLMFLEET_REGISTRY_CACHE_S) and known models."""

    def __init__(self, redis: Redis, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._settings = settings
        self._clock = clock
        self._cached: list[WorkerInfo] = []
        self._cached_at: float | None = None
        self._refreshing = asyncio.Lock()

    async def live_workers(self, max_age_s: float | None = None) -> list[WorkerInfo]:
        """Every live worker (see the module docstring for what counts as live), from a read at most `max_age_s`
        old (and never older than LLMFLEET_REGISTRY_CACHE_S)."""
        cache_s = self._settings.registry_cache_s
        max_age_s = cache_s if max_age_s is None else min(max_age_s, cache_s)
        async with self._refreshing:  # one refresh at a time; the others reuse its result
            now = self._clock()
            if self._cached_at is not None and now - self._cached_at < max_age_s:
                return self._cached
            self._cached, self._cached_at = await self._read(now), now
            return self._cached

    async def reporting_workers(self) -> list[WorkerInfo]:
        """Every worker whose entry is fresh, draining ones included (for the dashboard; never cached)."""
        return await self._read(self._clock(), live_only=False)

    async def _read(self, now: float, *, live_only: bool = True) -> list[WorkerInfo]:
        ttl = self._settings.heartbeat_ttl_s
        with redis_unavailable(self._settings.retry_after_s):
            fresh = await run_async(self._redis, fresh_workers(now, ttl))
        return [info for info in fresh if info.is_live(now, ttl) or not live_only]

    async def live_models(self, max_age_s: float | None = None) -> dict[str, list[WorkerInfo]]:
        """Models with at least one live worker, each with its workers (from a read at most `max_age_s` old)."""
        models: dict[str, list[WorkerInfo]] = {}
        for worker in await self.live_workers(max_age_s):
            models.setdefault(worker.model, []).append(worker)
        return models

    async def is_known(self, model: str) -> bool:
        """True while some worker served `model` within LLMFLEET_MODEL_MEMORY_S."""
        with redis_unavailable(self._settings.retry_after_s):
            score = await self._redis.zscore(keys.MODELS_INDEX, model)
        return score is not None and score >= self._clock() - self._settings.model_memory_s

    async def known_models(self) -> list[str]:
        """Every model some worker served within LLMFLEET_MODEL_MEMORY_S, sorted."""
        with redis_unavailable(self._settings.retry_after_s):
            names = await self._redis.zrangebyscore(keys.MODELS_INDEX, self._clock() - self._settings.model_memory_s,
                                                    "+inf")
        return sorted(name.decode(errors="replace") for name in names)

    async def model_facts(self) -> dict[str, dict[str, Any]]:
        """Every model's published file facts (worker/model_facts.py); an unreadable entry is skipped."""
        with redis_unavailable(self._settings.retry_after_s):
            raw = await self._redis.hgetall(keys.MODEL_FACTS)
        out = {}
        for name, value in raw.items():
            try:
                facts = json.loads(value)
            except ValueError:
                log.warning("unreadable model facts ignored")
                continue
            if isinstance(facts, dict):
                out[name.decode(errors="replace") if isinstance(name, bytes) else name] = facts
        return out
