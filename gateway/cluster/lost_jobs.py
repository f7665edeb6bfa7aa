"""A job that a Redis failover lost before any worker took it is queued again.

Redis replicates asynchronously: a primary killed right after it answered an XADD may never have sent the job to
the replica that Sentinel promotes. The gateway's pub/sub connection dies with that primary, so every open stream
gets RESYNC once the subscriber dialled the new one (gateway/cluster/subscriber.py). A stream that has seen no
event and whose journal is empty then looks for its job's entry in its stream; none there means the job is gone
(a finished job's journal holds its events, and replication is ordered: what followed the XADD went with it), and
the same job is written again. A worker that took the lost job from the dead primary and still runs it is fenced
as a stalled one is (worker/failover/fencing.py): the later taking wins, the stream resumes from the journal.
A job that went through its class's fair queue (gateway/cluster/fair_share.py) has no entry id of its own: it is
there while the queue holds its id or the stream (or the lane a newcomer skips the queue by) an entry with its
bytes (a short scan; failovers are rare), and
is otherwise written straight into the stream (it has waited its turn already).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from redis.asyncio import Redis

from shared import keys

log = logging.getLogger(__name__)
FAIR_SCAN = 1000  # entries of a shared stream looked through for a fair-queued job's bytes


@dataclass(frozen=True)
class QueuedEntry:
    """Where the gateway wrote a job: its stream, its entry id and its bytes (to write it again if lost)."""

    stream: str
    entry_id: bytes  # b"": written through a fair queue (no entry id of its own)
    payload: bytes
    maxlen: int
    fair_queue: str = ""  # the fair queue's key it went through, if it did
    lane: str = ""  # the stream its fair queue sends a newcomer to (shared/fair_queue.py), if it went through one


async def requeue_if_lost(redis: Redis, entry: QueuedEntry, request_id: str) -> QueuedEntry | None:
    """Write the job again when its entry is no longer in its stream (nor in its fair queue): the new entry, or
    None when it was there."""
    if entry.fair_queue:
        if await redis.zscore(entry.fair_queue, request_id) is not None:
            return None
        for stream in dict.fromkeys(s for s in (entry.stream, entry.lane) if s):
            if any(fields.get(keys.JOB_FIELD.encode()) == entry.payload
                   for _id, fields in await redis.xrange(stream, count=FAIR_SCAN)):
                return None
    elif await redis.xrange(entry.stream, min=entry.entry_id, max=entry.entry_id, count=1):
        return None
    entry_id = await redis.xadd(entry.stream, {keys.JOB_FIELD: entry.payload}, maxlen=entry.maxlen, approximate=True)
    log.warning("job %s was gone from %s after Redis came back (a failover lost it): queued again", request_id,
                entry.stream)
    return replace(entry, entry_id=entry_id, fair_queue="", lane="")
