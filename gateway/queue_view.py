"""A model's queue as admission sees it: waiting, in flight, and placed waiting per worker, read from Redis.

`read_queue_state` reads every stream of the model (shared and per-worker, every priority class) in one
pipeline. Admission does not read it per request: under a burst of hundreds, a read per request (9 streams'
XINFO GROUPS and XLEN each for 2 workers) was most of the gateway's work while the workers took every core.
`QueueView` shares one read among the requests that arrive while it is under way (single flight), may reuse
it for READ_EVERY_S (0 by default: a reused read counted the burst's jobs that workers had already taken as
waiting, and a small queue limit refused them; single flight alone gave the same burst numbers), and adds what this gateway queued since that read ended (per placed worker
too), so a burst still counts itself. A job admitted but not yet written is counted by the broker
(`_admitting`) until its XADD returns; one whose XADD returned while the read was under way is taken to be in
the read (it was written before the read's reply came; a job Redis wrote just after the read's XINFO is missed
until the next read). Other gateways' jobs are seen at the next read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from gateway.redis_errors import redis_unavailable
from shared import keys

READ_EVERY_S = 0.0  # a read is reused this long (0: shared only by requests that arrive while it is under way)
QueueState = tuple[int, int, dict[str, int]]  # (waiting, in flight, placed waiting per worker id)


async def read_queue_state(redis: Redis, model: str, retry_after_s: float) -> QueueState:
    """(waiting, in flight, placed waiting per worker id): jobs of `model` not yet taken (shared and per-worker
    streams, every priority class), those taken but not yet acked, and per worker those on its own streams."""
    with redis_unavailable(retry_after_s):
        placed = sorted(m.decode(errors="replace") for m in await redis.smembers(keys.placed_workers(model)))
    owners = [""] * len(keys.PRIORITY_ORDER) + [w for w in placed for _ in keys.PRIORITY_ORDER]
    streams = keys.jobs_streams(model) + [s for w in placed for s in keys.worker_jobs_streams(model, w)]
    per_worker: dict[str, int] = {}
    with redis_unavailable(retry_after_s):
        pipe = redis.pipeline(transaction=False)
        for stream in streams:
            pipe.xinfo_groups(stream)
            pipe.xlen(stream)
        replies = await pipe.execute(raise_on_error=False)
        total = in_flight = 0
        for owner, stream, groups, length in zip(owners, streams, replies[::2], replies[1::2], strict=True):
            if isinstance(length, Exception):
                raise length
            group = None
            if not isinstance(groups, ResponseError):
                group = next((g for g in groups if _text(g.get("name")) == keys.JOBS_GROUP), None)
            if group is None:
                if not owner:  # a per-worker stream's group is its worker's (or a drainer's) to create
                    await _create_group(redis, stream)
                depth = int(length)
            else:
                in_flight += int(group.get("pending") or 0)
                if group.get("lag") is not None:
                    depth = int(group["lag"])
                else:  # Redis cannot tell the lag after deletions past its position: entries minus in flight
                    depth = max(0, int(length) - int(group.get("pending") or 0))
            total += depth
            if owner:
                per_worker[owner] = per_worker.get(owner, 0) + depth
    return total, in_flight, per_worker


@dataclass
class _Snapshot:
    state: QueueState
    read_at: float
    queued_before: int  # this gateway's queued count when the read ended
    placed_before: dict[str, int] = field(default_factory=dict)  # the same per worker


class QueueView:
    """Admission's shared, briefly reused read of each model's queue plus this gateway's own jobs since."""

    def __init__(self, read: Callable[[str], Awaitable[QueueState]], *, max_age_s: float = READ_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._max_age_s = max_age_s
        self._clock = clock
        self._snapshots: dict[str, _Snapshot] = {}
        self._reads: dict[str, asyncio.Future[_Snapshot]] = {}
        self._queued: dict[str, int] = {}  # model -> jobs this gateway queued, ever
        self._placed: dict[str, dict[str, int]] = {}  # model -> worker id -> jobs placed on its streams, ever

    def note_queued(self, model: str, worker_id: str | None) -> None:
        """Count a job this gateway wrote to one of the model's streams (its worker's when placed)."""
        self._queued[model] = self._queued.get(model, 0) + 1
        if worker_id is not None:
            placed = self._placed.setdefault(model, {})
            placed[worker_id] = placed.get(worker_id, 0) + 1

    async def state(self, model: str) -> QueueState:
        """(waiting, in flight, placed waiting per worker) from a read at most max_age_s old, plus the jobs
        this gateway queued since that read ended."""
        snapshot = self._snapshots.get(model)
        if snapshot is None or self._clock() - snapshot.read_at >= self._max_age_s:
            snapshot = await self._fresh(model)
        waiting, in_flight, per_worker = snapshot.state
        placed = self._placed.get(model, {})
        own = {w: n - snapshot.placed_before.get(w, 0) for w, n in placed.items()}
        merged = {w: per_worker.get(w, 0) + own.get(w, 0) for w in per_worker.keys() | own.keys()}
        return waiting + self._queued.get(model, 0) - snapshot.queued_before, in_flight, merged

    async def _fresh(self, model: str) -> _Snapshot:
        """A new read, or the one already under way for the model (read again if its reader was cancelled)."""
        while True:
            pending = self._reads.get(model)
            if pending is None:
                return await self._lead(model)
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and task is not None and not task.cancelling():
                    continue  # the reader's own request was cancelled (its client left), not this one
                raise

    async def _lead(self, model: str) -> _Snapshot:
        """Read the queue state for every request waiting on it."""
        pending: asyncio.Future[_Snapshot] = asyncio.get_running_loop().create_future()
        self._reads[model] = pending
        try:
            state = await self._read(model)
        except asyncio.CancelledError:
            pending.cancel()
            raise
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: waiters re-raise it, an unawaited future does not warn
            raise
        else:  # jobs whose XADD returned during the read are taken to be in it
            before, placed_before = self._queued.get(model, 0), dict(self._placed.get(model, {}))
            snapshot = _Snapshot(state, self._clock(), before, placed_before)
            self._snapshots[model] = snapshot
            pending.set_result(snapshot)
            return snapshot
        finally:
            del self._reads[model]


async def _create_group(redis: Redis, stream: str) -> None:
    try:
        await redis.xgroup_create(stream, keys.JOBS_GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
