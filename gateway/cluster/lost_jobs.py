"""A job that a Redis failover lost before any worker took it is queued again.

Redis replicates asynchronously: a primary killed right after it answered an XADD may never have sent the job to
the replica that Sentinel promotes. The gateway's pub/sub connection dies with that primary, so every open stream
gets RESYNC once the subscriber dialled the new one (gateway/cluster/subscriber.py). A stream that has seen no
event and whose journal is empty then looks for its job's entry in its stream; none there means the job is gone
(a finished job's journal holds its events, and replication is ordered: what followed the XADD went with it), and
the same job is written again. A worker that took the lost job from the dead primary and still runs it is fenced
as a stalled one is (worker/failover/fencing.py): the later taking wins, the stream resumes from the journal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from redis.asyncio import Redis

from shared import keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueuedEntry:
    """Where the gateway wrote a job: its stream, its entry id and its bytes (to write it again if lost)."""

    stream: str
    entry_id: bytes
    payload: bytes
    maxlen: int


async def requeue_if_lost(redis: Redis, entry: QueuedEntry, request_id: str) -> QueuedEntry | None:
    """Write the job again when its entry is no longer in its stream: the new entry, or None when it was there."""
    if await redis.xrange(entry.stream, min=entry.entry_id, max=entry.entry_id, count=1):
        return None
    entry_id = await redis.xadd(entry.stream, {keys.JOB_FIELD: entry.payload}, maxlen=entry.maxlen, approximate=True)
    log.warning("job %s was gone from %s after Redis came back (a failover lost it): queued again", request_id,
                entry.stream)
    return replace(entry, entry_id=entry_id)
