"""A model's queue as admission and placement see it: waiting, in flight, and per worker its placed jobs
waiting and the jobs it holds, read from Redis.

`read_queue_state` reads every stream of the model (shared and per-worker, every priority class) in one
pipeline: each stream's consumer group (lag, pending) and its consumers (pending per worker: the jobs a worker
took and has not acked, wherever they were queued, counted the moment it takes them, whereas its heartbeat's
load lags by up to a heartbeat and the registry cache). Admission does not read it per request: under a burst of hundreds, a read per request (9 streams'
XINFO GROUPS and XLEN each for 2 workers) was most of the gateway's work while the workers took every core.
`QueueView` shares one read among the requests that arrive while it is under way (single flight), may reuse
it for READ_EVERY_S (0 by default: a reused read counted the burst's jobs that workers had already taken as
waiting, and a small queue limit refused them; single flight alone gave the same burst numbers), and adds what this gateway queued since that read ended (per placed worker
too), so a burst still counts itself. A job admitted but not yet written is counted by the broker
(`_admitting`) until its XADD returns; one whose XADD returned while the read was under way is taken to be in
the read (it was written before the read's reply came; a job Redis wrote just after the read's XINFO is missed
until the next read). Other gateways' jobs are seen at the next read.

Placement does not use this view: it counts each worker's jobs in Redis, in the same script that writes the
job (gateway/cluster/placer.py), so every gateway's placements count toward a worker the moment they are made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis

from gateway.http.redis_errors import redis_unavailable
from shared.redis_commands import QueueState, queue_states, run_async

READ_EVERY_S = 0.0  # a read is reused this long (0: shared only by requests that arrive while it is under way)


async def read_queue_state(redis: Redis, model: str, retry_after_s: float) -> QueueState:
    """The model's QueueState, read now (shared/redis_commands.py queue_states: the placed-workers set, then
    every stream in one pipeline); a shared stream without its group gets one."""
    with redis_unavailable(retry_after_s):
        states = await run_async(redis, queue_states([model], create_missing_groups=True))
    return states[model]


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
        """The model's QueueState from a read at most max_age_s old, plus the jobs this gateway queued since
        that read ended."""
        snapshot = self._snapshots.get(model)
        if snapshot is None or self._clock() - snapshot.read_at >= self._max_age_s:
            snapshot = await self._fresh(model)
        waiting = snapshot.state.waiting + self._queued.get(model, 0) - snapshot.queued_before
        return snapshot.state._replace(waiting=waiting, placed=self._placed_now(model, snapshot))

    def placed_workers(self, model: str) -> set[str]:
        """The workers with placed streams of the model as of the last read and this gateway's placements since
        (placement counts the jobs other workers took from them: a dead worker's, taken over)."""
        snapshot = self._snapshots.get(model)
        return set(snapshot.state.placed if snapshot else ()) | set(self._placed.get(model, ()))

    def _placed_now(self, model: str, snapshot: _Snapshot | None) -> dict[str, int]:
        """Per worker: placed jobs waiting in the snapshot plus those this gateway placed since it."""
        placed = self._placed.get(model, {})
        if snapshot is None:
            return dict(placed)
        own = {w: n - snapshot.placed_before.get(w, 0) for w, n in placed.items()}
        read = snapshot.state.placed
        return {w: read.get(w, 0) + own.get(w, 0) for w in read.keys() | own.keys()}

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
