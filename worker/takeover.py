"""Finding the jobs of dead or stalled workers, and setting poison jobs aside.

A worker takes over (XCLAIM) the pending entries of consumers whose registry entry has expired at once
(failover by heartbeat TTL), and entries idle past the lease whatever their owner (XAUTOCLAIM). Every
claim counts as a delivery; a job delivered more than LLMFLEET_MAX_DELIVERIES times without an ack is a
poison job (each worker that took it died or stalled on it) and goes to `deadletter:{model}` instead.
"""

from __future__ import annotations

import time
from typing import Any

from shared import keys

DEAD_LETTER_MAXLEN = 10_000  # dead-lettered jobs kept per model (approximate trim)


def claim_stalled(redis: Any, stream: str, worker_id: str, *, count: int, ttl_s: float, lease_s: float) -> list[Any]:
    """Claim up to `count` entries of dead consumers (at once) and of silent ones (after the lease)."""
    claimed = claim_from_dead_workers(redis, stream, worker_id, count=count, ttl_s=ttl_s, lease_s=lease_s)
    if len(claimed) < count:
        reply = redis.xautoclaim(stream, keys.JOBS_GROUP, worker_id, start_id="0-0",
                                 min_idle_time=int(lease_s * 1000), count=count - len(claimed))
        claimed += reply[1] if reply else []
    return claimed


def claim_from_dead_workers(redis: Any, stream: str, worker_id: str, *, count: int, ttl_s: float,
                            lease_s: float) -> list[Any]:
    """Pending entries of consumers whose registry entry has expired (failover by heartbeat TTL)."""
    claimed: list[Any] = []
    for consumer in redis.xinfo_consumers(stream, keys.JOBS_GROUP):
        name = _text(consumer["name"])
        if name == worker_id or redis.exists(keys.worker_key(name)):
            continue
        if not consumer.get("pending"):  # a dead worker that held nothing: forget it once it is long idle
            if consumer.get("idle", 0) > lease_s * 1000:
                redis.xgroup_delconsumer(stream, keys.JOBS_GROUP, name)
            continue
        pending = redis.xpending_range(stream, keys.JOBS_GROUP, min="-", max="+", count=count, consumername=name)
        ids = [p["message_id"] for p in pending]
        if ids:  # min idle: the dead worker's TTL; a live owner renews well within it
            claimed += [e for e in redis.xclaim(stream, keys.JOBS_GROUP, worker_id, int(ttl_s * 1000), ids)
                        if e and e[1] is not None]
        if len(claimed) >= count:
            break
    return claimed[:count]


def dead_letter(redis: Any, model: str, job_bytes: bytes, *, worker_id: str, deliveries: int) -> None:
    """Append a poison job to the model's dead-letter stream (with who set it aside and how often it ran)."""
    redis.xadd(keys.deadletter_stream(model), {keys.JOB_FIELD: job_bytes, "worker": worker_id,
                                               "deliveries": str(deliveries), "at": f"{time.time():.3f}"},
               maxlen=DEAD_LETTER_MAXLEN, approximate=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
