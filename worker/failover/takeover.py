"""Finding the jobs of dead or stalled workers, and setting poison jobs aside.

A worker takes over (XCLAIM) the pending entries of consumers whose registry entry has expired at once
(failover by heartbeat TTL), entries read but never taken past UNTAKEN_AFTER_S, and entries idle past the
lease whatever their owner (XAUTOCLAIM). Every claim counts as a delivery; a job delivered more than
LLMFLEET_MAX_DELIVERIES times without an ack is a poison job (each worker that took it died or stalled on it)
and goes to `{model}:deadletter` instead.

Read but never taken: a worker owns a job (worker/failover/fencing.py) in the same turn as it reads it, within
milliseconds. An entry pending for a live consumer for seconds with no owner naming that consumer was read by
a worker that stopped right then (SIGSTOP, a long pause; its blocking read was answered while it was stopped),
and would otherwise wait for its lease. Claiming it is safe: the stalled worker's own take is refused once the
entry has moved ("lost"), and should it have taken the job in the instant between the check and the claim, the
claimer's take starts a new epoch and fences it off.

Read by this very worker and never taken: the reply of its XREADGROUP was lost (Redis paused past the socket
timeout: the read failed and its connection closed, but Redis delivered the entries to this consumer when it
resumed). Nobody else moves them before the lease (they are the live reader's own), so the worker claims them
back itself once they are idle past LOST_READ_AFTER_S, longer than a reply can still arrive (the socket
timeout), and takes them with a new epoch. Entries it did take (its owner value names it: running, or ended with
the final publish still on its way) are never claimed, nor those the caller names in `skip`.

A worker restarted under its own id (`--worker-id`, a StatefulSet pod name) finds the entries its dead
predecessor held pending for its own consumer name, and under a live registry entry: nobody else would move
them before the lease ran out. At start it lists them (own_pending) and takes them back at once (claim_own),
as a takeover: a new owner epoch fences the dead process off, and the streams resume from their journals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from shared import codec, keys
from shared.codec import WireFormatError
from shared.messages import Job
from shared.redis_commands import reply_text
from shared.redis_sockets import COMMAND_TIMEOUT_S
from worker.failover.resume import JournalState, JournalUnusable, read_journal

log = logging.getLogger(__name__)
DEAD_LETTER_MAXLEN = 10_000  # dead-lettered jobs kept per model (approximate trim)
UNTAKEN_AFTER_S = 3.0  # an entry read this long ago and never taken: its reader stalled as it read it
LOST_READ_AFTER_S = COMMAND_TIMEOUT_S + 1.0  # own entries idle this long and never taken: the read's reply was lost
OWN_PENDING_MAX = 10_000  # entries an earlier process under the same id may have left, per stream


def pending_counts(redis: Any, streams: list[str]) -> list[int]:
    """Each stream's pending entries in the jobs group, in one round trip (-1 where Redis could not say: a stream
    or group not there yet); a stream with none has nothing a reclaim could take."""
    pipe = redis.pipeline(transaction=False)
    for stream in streams:
        pipe.xpending(stream, keys.JOBS_GROUP)
    return [int(reply["pending"]) if isinstance(reply, dict) else -1 for reply in pipe.execute(raise_on_error=False)]


def claim_from_streams(redis: Any, streams: list[str], worker_id: str, *, model: str, count: int, ttl_s: float,
                       lease_s: float, skip: dict[str, list[str]], required: set[str]) -> list[tuple[str, str, Any]]:
    """claim_stalled over `streams` in turn, up to `count` entries in all: (stream, entry id, fields); the entries in
    `skip` (per stream) are left alone. NOGROUP on a stream in `required` raises (it is recreated); on another, that
    stream is skipped (forgotten meanwhile)."""
    found: list[tuple[str, str, Any]] = []
    for stream in streams:
        if count <= 0:
            break
        try:
            claimed = claim_stalled(redis, stream, worker_id, count=count, ttl_s=ttl_s, lease_s=lease_s, model=model,
                                    request_id_of=request_id_of, skip=frozenset(skip.get(stream, ())))
        except ResponseError as exc:
            if stream in required:
                raise
            log.debug("skipping %s in the reclaim: %s", stream, exc)
            continue
        count -= len(claimed)
        found += [(stream, reply_text(message_id), fields) for message_id, fields in claimed]
    return found


def claim_stalled(redis: Any, stream: str, worker_id: str, *, count: int, ttl_s: float, lease_s: float,
                  model: str = "", request_id_of: Callable[[dict], str | None] | None = None,
                  skip: frozenset[str] = frozenset()) -> list[Any]:
    """Claim up to `count` entries of dead consumers (at once), of stalled readers or lost reads that were never
    taken (with `request_id_of`, which names an entry's request of `model`, the stream's; not the own entries in
    `skip`), and of silent ones (after the lease)."""
    claimed = claim_from_dead_workers(redis, stream, worker_id, count=count, ttl_s=ttl_s, lease_s=lease_s)
    if len(claimed) < count and request_id_of is not None and lease_s > UNTAKEN_AFTER_S:
        claimed += claim_untaken(redis, stream, worker_id, model=model, count=count - len(claimed),
                                 request_id_of=request_id_of, skip=skip)
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
        name = reply_text(consumer["name"])
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


def claim_untaken(redis: Any, stream: str, worker_id: str, *, model: str, count: int,
                  request_id_of: Callable[[dict], str | None], skip: frozenset[str] = frozenset()) -> list[Any]:
    """Entries read and never taken (no owner names their reader): by other consumers over UNTAKEN_AFTER_S ago,
    by this one over LOST_READ_AFTER_S ago (its read's reply was lost), except the entry ids in `skip`."""
    idle_ms, own_idle_ms = int(UNTAKEN_AFTER_S * 1000), int(LOST_READ_AFTER_S * 1000)
    # a wider window than `count`: entries a stalled owner took (skipped below) must not hide untaken ones
    pending = redis.xpending_range(stream, keys.JOBS_GROUP, min="-", max="+", count=4 * count + 16,
                                   idle=min(idle_ms, own_idle_ms))
    claimed: list[Any] = []
    for entry in pending:
        if len(claimed) >= count:
            break
        holder, entry_id = reply_text(entry["consumer"]), reply_text(entry["message_id"])
        own = holder == worker_id
        if entry_id in skip or int(entry["time_since_delivered"]) < (own_idle_ms if own else idle_ms):
            continue
        found = redis.xrange(stream, min=entry_id, max=entry_id, count=1)
        request_id = request_id_of(found[0][1]) if found else None
        owner = redis.get(keys.owner_key(model, request_id)) if request_id else None
        if owner is not None and (reply_text(owner) == "done" or reply_text(owner).split(":", 1)[-1] == holder):
            continue  # taken by its reader (only the lease may move it), or ended and about to be acked
        # the min idle time: an entry delivered or renewed meanwhile (its reader took it after all) stays
        claimed += [e for e in redis.xclaim(stream, keys.JOBS_GROUP, worker_id, own_idle_ms if own else idle_ms,
                                            [entry_id]) if e and e[1] is not None]
    return claimed


def own_pending(redis: Any, streams: list[str], worker_id: str) -> dict[str, list[str]]:
    """Per stream, the entry ids pending for `worker_id`'s own consumer: at a worker's start, those of an earlier
    process that ran under the same id and died holding them."""
    found: dict[str, list[str]] = {}
    for stream in streams:
        try:
            pending = redis.xpending_range(stream, keys.JOBS_GROUP, min="-", max="+", count=OWN_PENDING_MAX,
                                           consumername=worker_id)
        except ResponseError:
            continue  # no such stream or group yet
        if pending:
            found[stream] = [reply_text(p["message_id"]) for p in pending]
    return found


def claim_own(redis: Any, stream: str, worker_id: str, entry_ids: list[str]) -> list[Any]:
    """XCLAIM (at once) entries pending for this worker's own id; each claim counts as a delivery (poison check)."""
    return [e for e in redis.xclaim(stream, keys.JOBS_GROUP, worker_id, 0, entry_ids) if e and e[1] is not None]


def dead_letter(redis: Any, model: str, job_bytes: bytes, *, worker_id: str, deliveries: int) -> None:
    """Append a poison job to the model's dead-letter stream (with who set it aside and how often it ran)."""
    redis.xadd(keys.deadletter_stream(model), {keys.JOB_FIELD: job_bytes, "worker": worker_id,
                                               "deliveries": str(deliveries), "at": f"{time.time():.3f}"},
               maxlen=DEAD_LETTER_MAXLEN, approximate=True)


def read_for_takeover(redis: Any, job: Job, epoch: int, *, model: str, worker_id: str,
                      max_deliveries: int) -> tuple[JournalState | None, int, str, int]:
    """A job taken over with owner epoch `epoch`: its journal (read after the fence went up; None when unusable),
    one past its last event's seq, why it is unusable ("" if not), and the deliveries it had when it is set aside
    as a poison job (0: it is not). Takings (owner epochs) count, not reads: a read whose taking Redis refused
    (OOM) never ran the job."""
    journal, next_seq, problem = None, 0, ""
    try:
        journal = read_journal(redis, job.model, job.id)
        next_seq = journal.next_seq
    except JournalUnusable as exc:
        log.warning("cannot resume job %s: %s", job.id, exc)
        next_seq, problem = exc.next_seq, str(exc)
    if (journal is None or not journal.terminal) and epoch > max_deliveries:
        dead_letter(redis, model, codec.encode_job(job), worker_id=worker_id, deliveries=epoch - 1)  # this one not run
        return journal, next_seq, problem, epoch - 1
    return journal, next_seq, problem, 0


def request_id_of(fields: dict) -> str | None:
    """The request id of a job stream entry (None when it cannot be read)."""
    try:
        return codec.decode_job(fields[keys.JOB_FIELD.encode()]).id
    except (WireFormatError, KeyError):
        return None
