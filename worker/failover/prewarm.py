"""Warming a takeover before the verdict: the jobs of a worker that has missed its heartbeats, read (never taken).

Failover waits for a dead worker's registry entry to expire (LLMFLEET_HEARTBEAT_TTL_S) before anyone claims its
jobs; after the claim, the resumed streams' KV comes in from the host tier (worker/engine/kv/tier_link.py), 0.3-0.5 s
for 8 streams of 2,000 tokens of a 1B. A worker whose entry has not been renewed for SUSPECT_AFTER_BEATS heartbeat
intervals is probably dead: the survivors read its pending jobs and their journals now, and copy the tier's blocks
of each stream (prompt and the tokens already sent) into their own pool's prefix cache. When the claim comes, the
takeover's admission finds them cached and only the last partial block is read.

Nothing is claimed, owned or written: a suspect that was only slow (a long pause) keeps its jobs, and the survivor
has spent one tier read per stream on prefix-cache blocks that later admissions evict as any others. Each job is
warmed once (the warmer remembers the ids it read: a suspect that recovers and dies later is not warmed again; its
claim then reads the tier as before).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from shared import codec, keys
from shared.codec import WireFormatError
from shared.messages import GenerateJob
from shared.redis_commands import reply_text
from worker.failover.resume import JournalState, JournalUnusable, read_journal

log = logging.getLogger(__name__)
SUSPECT_AFTER_BEATS = 2  # a registry entry not renewed for this many heartbeat intervals: its worker is suspect
SEEN_MAX = 10_000  # job ids remembered as warmed; past this the memory starts over (a job may be warmed twice)


@dataclass
class SuspectJob:
    """A generation a suspect worker holds, and its journal as read now: what a takeover would resume."""

    job: GenerateJob
    journal: JournalState
    holder: str  # the suspect worker's id


def suspect_after_ms(interval_s: float, ttl_s: float) -> int:
    """The registry entry's remaining TTL (ms) under which its worker is suspect; 0 (never) where the TTL leaves
    no room for SUSPECT_AFTER_BEATS missed beats. The entry's TTL is whole seconds (worker/wire_commands.py)."""
    full_ms = max(1, int(ttl_s)) * 1000
    return max(0, full_ms - int(SUSPECT_AFTER_BEATS * interval_s * 1000))


def suspect_jobs(redis: Any, streams: list[str], worker_id: str, *, model: str, interval_s: float, ttl_s: float,
                 count: int, seen: set[str]) -> list[SuspectJob]:
    """Up to `count` generations pending for suspect workers on `streams` (not those in `seen`, nor any whose job
    or journal cannot be read), with their journals."""
    under_ms = suspect_after_ms(interval_s, ttl_s)
    found: list[SuspectJob] = []
    if under_ms <= 0:
        return found
    for stream in streams:
        if len(found) >= count:
            break
        try:
            consumers = [reply_text(c["name"]) for c in redis.xinfo_consumers(stream, keys.JOBS_GROUP)
                         if c.get("pending") and reply_text(c["name"]) != worker_id]
        except ResponseError:
            continue  # no such stream or group (yet)
        for holder in consumers:
            remaining = redis.pttl(keys.worker_key(holder))
            if not 0 <= remaining < under_ms:  # renewed lately (live), or gone (the reclaim's to take)
                continue
            found += _pending_generations(redis, stream, holder, model=model, count=count - len(found), seen=seen)
    return found


def _pending_generations(redis: Any, stream: str, holder: str, *, model: str, count: int,
                         seen: set[str]) -> list[SuspectJob]:
    """The holder's pending generations on `stream` with a usable journal, up to `count`, none in `seen`."""
    pending = redis.xpending_range(stream, keys.JOBS_GROUP, min="-", max="+", count=count, consumername=holder)
    found: list[SuspectJob] = []
    for entry in pending:
        entry_id = reply_text(entry["message_id"])
        read = redis.xrange(stream, min=entry_id, max=entry_id, count=1)
        try:
            job = codec.decode_job(read[0][1][keys.JOB_FIELD.encode()]) if read else None
        except (WireFormatError, KeyError):
            continue
        if not isinstance(job, GenerateJob) or job.id in seen:
            continue
        seen.add(job.id)
        try:
            journal = read_journal(redis, model, job.id)
        except JournalUnusable:
            continue
        if not journal.terminal:
            found.append(SuspectJob(job, journal, holder))
    return found


class TakeoverWarmer:
    """Suspect workers' jobs: found on the job feeder's thread (`look`, beside its reclaim), warmed on the loop's
    (`drain`), where the KV pool lives."""

    def __init__(self, *, model: str, worker_id: str, interval_s: float, ttl_s: float) -> None:
        self.model, self.worker_id = model, worker_id
        self.interval_s, self.ttl_s = interval_s, ttl_s
        self.seen: set[str] = set()
        self._found: list[SuspectJob] = []
        self._lock = threading.Lock()

    def look(self, redis: Any, streams: list[str], count: int) -> bool:
        """Find up to `count` new suspect jobs on `streams`; whether any was found."""
        if len(self.seen) > SEEN_MAX:
            self.seen.clear()
        found = suspect_jobs(redis, streams, self.worker_id, model=self.model, interval_s=self.interval_s,
                             ttl_s=self.ttl_s, count=count, seen=self.seen)
        for holder in dict.fromkeys(s.holder for s in found):
            log.info("worker %s missed its heartbeats; warming the takeover of its jobs %s", holder,
                     ", ".join(s.job.id for s in found if s.holder == holder))
        with self._lock:
            self._found += found
        return bool(found)

    def drain(self, limit: int | None = None) -> list[SuspectJob]:
        """Up to `limit` (None: all) of the suspect jobs found so far, oldest first."""
        with self._lock:
            taken, self._found = self._found[:limit], self._found[len(self._found) if limit is None else limit :]
            return taken
