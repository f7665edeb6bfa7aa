"""The LoRA adapters each base model should have loaded, as the admin API writes them to Redis (the workers follow).

`keys.loras_desired(model)` is a hash of adapter name -> {"source", "added"} (JSON), durable, so a worker that
starts later or after a crash loads the adapters too; `keys.loras_version(model)` counts the changes (a worker's
registry entry says which version it followed); `keys.loras_errors(model)` holds a worker's load error per
adapter. gateway/admin/lora_routes.py drives these through LoraSet; the workers' side is worker/loras.py.
"""

from __future__ import annotations

import json
import time

from redis.asyncio import Redis

from gateway.http.redis_errors import redis_unavailable
from shared import keys
from shared.settings import Settings


class LoraSet:
    """Reads and writes the desired adapters of each base model and the load errors workers report."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self._retry_after_s = settings.retry_after_s

    async def names(self, model: str) -> list[bytes]:
        """The names of the model's desired adapters."""
        with redis_unavailable(self._retry_after_s):
            return await self._redis.hkeys(keys.loras_desired(model))

    async def add(self, model: str, name: str, source: str) -> int:
        """Make `name` (from `source`) desired, forgetting its last load error; the set's new version."""
        with redis_unavailable(self._retry_after_s):
            pipe = self._redis.pipeline(transaction=True)
            pipe.hdel(keys.loras_errors(model), name)
            pipe.hset(keys.loras_desired(model), name, json.dumps({"source": source, "added": time.time()}))
            pipe.incr(keys.loras_version(model))
            return int((await pipe.execute())[-1])

    async def load_error(self, model: str, name: str) -> str | None:
        """The load error a worker reported for the adapter, if any."""
        with redis_unavailable(self._retry_after_s):
            error = await self._redis.hget(keys.loras_errors(model), name)
        return None if error is None else error.decode(errors="replace")

    async def sources(self, model: str) -> dict[str, str | None]:
        """Each desired adapter of the model with the source it was added from."""
        with redis_unavailable(self._retry_after_s):
            desired = await self._redis.hgetall(keys.loras_desired(model))
        return {name.decode(errors="replace"): json.loads(raw).get("source") if raw else None
                for name, raw in desired.items()}

    async def remove(self, model: str, name: str) -> bool:
        """Take the adapter out of the model's desired set; whether it was there."""
        with redis_unavailable(self._retry_after_s):
            pipe = self._redis.pipeline(transaction=True)
            pipe.hdel(keys.loras_desired(model), name)
            pipe.incr(keys.loras_version(model))
            removed, _version = await pipe.execute()
        return bool(removed)
