"""The worker side of the Redis contract, as commands queued on a pipeline (sync or asyncio alike).

One place for what every worker (and bench/standin_worker.py) must do the same way: the registry entry the
gateway reads, the journal-then-publish of an event, and the ack that also deletes the job entry.
"""

from __future__ import annotations

from typing import Any

from shared import keys
from shared.registry import RegistryEntry

JOURNAL_MAXLEN = 100_000  # events kept per request (approximate trim)


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


def queue_event(pipe: Any, request_id: str, seq: int, data: bytes, *, journal_ttl_s: int, refresh_ttl: bool) -> None:
    """Queue one encoded event: journal it first (so a gap is always refillable), then publish it."""
    journal = keys.journal_stream(request_id)
    pipe.xadd(journal, {keys.JOURNAL_SEQ_FIELD: str(seq), keys.JOURNAL_EVENT_FIELD: data},
              maxlen=JOURNAL_MAXLEN, approximate=True)
    if refresh_ttl:
        pipe.expire(journal, journal_ttl_s)
    pipe.publish(keys.events_channel(request_id), data)


def queue_job_done(pipe: Any, stream: str, message_id: str | bytes) -> None:
    """Queue XACK + XDEL of a finished job: the stream keeps only waiting and in-flight jobs, so
    XLEN - pending is the queue depth the gateway bounds (Redis 6.2 has no consumer-group lag)."""
    pipe.xack(stream, keys.JOBS_GROUP, message_id)
    pipe.xdel(stream, message_id)
