"""The worker side of the Redis contract, as commands queued on a pipeline (sync or asyncio alike).

One place for what every worker (and bench/standin_worker.py) must do the same way: the registry entry the
gateway reads. The journal-then-publish of an event and the ack that also deletes the job entry, which the
node agent writes too, are shared/redis_commands.py's.
"""

from __future__ import annotations

from typing import Any

from shared import keys
from shared.registry import RegistryEntry


def queue_registration(pipe: Any, entry: RegistryEntry, *, ttl_s: float) -> None:
    """Queue the registry hash (with its TTL) and the workers/models index scores of one heartbeat."""
    key = keys.worker_key(entry.worker_id)
    pipe.hset(key, mapping=entry.to_hash())
    pipe.expire(key, max(1, int(ttl_s)))
    pipe.zadd(keys.WORKERS_INDEX, {entry.worker_id: entry.heartbeat})
    pipe.zadd(keys.MODELS_INDEX, {entry.model: entry.heartbeat})


def queue_deregistration(pipe: Any, worker_id: str) -> None:
    """Queue the removal of a worker's registry entry (clean shutdown)."""
    pipe.delete(keys.worker_key(worker_id))
    pipe.zrem(keys.WORKERS_INDEX, worker_id)
