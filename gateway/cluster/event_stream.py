"""One submitted request's events, in seq order: duplicates (seq already seen) are dropped, a gap is filled from
llmfleet:journal:{id}, and what the journal cannot fill is an error. No event by the deadline (plus
LLMFLEET_DEADLINE_GRACE_S, so a worker's own deadline error wins) is a 504 DeadlineExceeded, and a cancel is
published; a gateway that lost Redis for LOST_AFTER_S (gateway/cluster/redis_health.py: a partition) ends its
waiting streams with a 503 Unavailable instead of holding them to the deadline. A request admitted with no live
worker of its model (scaled to zero) waits LLMFLEET_WORKER_WAIT_S for its first event; past that, with still no live
worker, its job is cancelled and the stream ends with a 503 NoWorkerAvailable (a worker that registered meanwhile
leaves it to the queue and the deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import NamedTuple, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.cluster.lost_jobs import QueuedEntry, requeue_if_lost
from gateway.cluster.redis_health import RedisHealth
from gateway.cluster.subscriber import RESYNC, QueueItem, Subscriber
from gateway.http.redis_errors import redis_unavailable
from gateway.http.tracing import note_event
from shared import codec, keys
from shared.codec import WireFormatError
from shared.errors import DeadlineExceeded, InternalError, NoWorkerAvailable, Unavailable
from shared.messages import Event, Job, is_terminal
from shared.settings import Settings

log = logging.getLogger(__name__)

REDIS_CHECK_EVERY_S = 1.0  # a stream waiting on events looks this often whether the gateway lost Redis


class StreamOwner(Protocol):
    """What a stream calls back into (the broker that created it): cancelling, unsubscribing, the journal."""

    redis: Redis
    settings: Settings
    clock: Callable[[], float]
    subscriber: Subscriber
    health: RedisHealth

    async def cancel(self, request_id: str, model: str, reason: str, deadline: float) -> None:
        """Cancel the request's job (its worker stops it within a step)."""

    async def has_live_worker(self, model: str) -> bool:
        """Whether a worker of `model` is alive now."""


class JobRef(NamedTuple):
    """What a stream needs to know of a job it did not queue itself (a resumed stream's)."""

    id: str
    model: str
    deadline: float


class EventStream:
    """The events of one submitted request, in seq order, ending after its terminal event."""

    def __init__(self, broker: StreamOwner, job: Job | JobRef, queue: asyncio.Queue[QueueItem], *,
                 worker_wait_until: float | None = None, queued: QueuedEntry | None = None) -> None:
        self._broker = broker
        self._queued = queued  # where this gateway wrote the job: queued again if a failover lost it
        self._worker_wait_until = worker_wait_until  # admitted with no live worker: wait for one until then
        self._queue = queue
        self.request_id = job.id
        self.model = job.model
        self.deadline = job.deadline
        self.retain = False  # a resumable stream's: at the end its journal is kept LLMFLEET_STREAM_RETENTION_S
        self.finished = False  # the terminal event was delivered (or the deadline ended the stream)
        self._closed = False
        self._expected = 0
        self._pending: dict[int, Event] = {}

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self.finished or self._closed:
            raise StopAsyncIteration
        while self._expected not in self._pending:
            item = await self._receive()
            if item is RESYNC:
                await self._fill_from_journal()
                await self._requeue_if_lost()
                continue
            event = self._decode(item)
            if event is None or event.seq < self._expected:
                continue  # not ours, or a duplicate (e.g. replayed by a replacement worker)
            self._worker_wait_until = None  # a worker took it
            self._pending.setdefault(event.seq, event)
            if event.seq > self._expected:
                await self._fill_from_journal()
                if self._expected not in self._pending:
                    raise InternalError(
                        f"events {self._expected}..{event.seq - 1} of request {self.request_id} were lost"
                    )
        event = self._pending.pop(self._expected)
        self._expected += 1
        note_event(event)  # its request span's finish reasons, usage or error (tracing on)
        if is_terminal(event):
            self.finished = True
        return event

    @property
    def buffered(self) -> bool:
        """True when the next event is already here (no wait needed)."""
        return not self._queue.empty() or self._expected in self._pending

    @classmethod
    def following(cls, broker: StreamOwner, job: Job | JobRef, queue: asyncio.Queue[QueueItem]) -> EventStream:
        """The events of a job already queued (a resumed stream), from its journal's first one: `queue` is
        subscribed; the journal is read before anything else, then live events follow (duplicates dropped)."""
        queue.put_nowait(RESYNC)
        stream = cls(broker, job, queue)
        stream.retain = True
        return stream

    async def close(self, reason: str = "client_disconnected", *, cancel: bool = True) -> None:
        """Stop listening; publish a cancel first if the terminal event was not seen (unless `cancel` is False:
        the job runs on for a client that may resume it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.finished and cancel:
                await self._broker.cancel(self.request_id, self.model, reason, self.deadline)
        finally:
            await self._broker.subscriber.unsubscribe(keys.events_channel(self.model, self.request_id), self._queue)
            if self.finished:
                await self._expire_journal()

    async def _expire_journal(self) -> None:
        """A finished journal goes now, or, for a resumable stream, after the retention time."""
        journal = keys.journal_stream(self.model, self.request_id)
        retention = self._broker.settings.stream_retention_s
        with contextlib.suppress(RedisError, OSError):  # else it expires on its own
            if self.retain and retention > 0:
                await self._broker.redis.expire(journal, max(1, math.ceil(retention)))
            else:
                await self._broker.redis.delete(journal)

    async def _receive(self) -> QueueItem:
        if not self._queue.empty():  # the common case under load: no timer, no task
            return self._queue.get_nowait()
        while (remaining := self.deadline + self._broker.settings.deadline_grace_s - self._broker.clock()) > 0:
            try:  # in slices: a gateway that lost Redis gives up long before the deadline
                async with asyncio.timeout(min(remaining, REDIS_CHECK_EVERY_S)):  # not wait_for (Python 3.11)
                    return await self._queue.get()
            except TimeoutError:
                if self._worker_wait_until is not None and self._broker.clock() >= self._worker_wait_until:
                    await self._end_the_wait_for_a_worker()
                if self._broker.health.lost:
                    raise Unavailable(f"the gateway lost its connection to Redis while request {self.request_id} "
                                      "was running; its outcome is unknown", retry_after=self._broker.settings
                                      .retry_after_s) from None
        with contextlib.suppress(asyncio.QueueEmpty):
            return self._queue.get_nowait()
        self.finished = True
        await self._broker.cancel(self.request_id, self.model, "deadline", self.deadline)
        raise DeadlineExceeded(f"request {self.request_id} did not finish before its deadline")

    async def _end_the_wait_for_a_worker(self) -> None:
        """LLMFLEET_WORKER_WAIT_S is over and no event came: a live worker of the model now leaves the job to the
        queue and the deadline; with none, the job is cancelled (a worker that comes later drops it) and the
        client gets a 503."""
        waited = self._broker.settings.worker_wait_s
        self._worker_wait_until = None
        if await self._broker.has_live_worker(self.model):
            return
        self.finished = True
        await self._broker.cancel(self.request_id, self.model, "no_worker", self.deadline)
        raise NoWorkerAvailable(f"no worker serving model '{self.model}' started within {waited:.0f} s "
                                "(LLMFLEET_WORKER_WAIT_S); please retry", retry_after=self._broker.settings.retry_after_s)

    async def _requeue_if_lost(self) -> None:
        """After a lost pub/sub connection, a job that sent no event yet is written again if it left its stream
        (a failover to a replica that never got it: gateway/cluster/lost_jobs.py)."""
        if self._queued is None or self._expected or self._pending:
            return
        with redis_unavailable(self._broker.settings.retry_after_s):
            self._queued = await requeue_if_lost(self._broker.redis, self._queued, self.request_id) or self._queued

    def _decode(self, item: QueueItem) -> Event | None:
        try:
            event = codec.decode_event(item)  # type: ignore[arg-type]
        except WireFormatError as exc:
            log.error("unreadable event for %s: %s", self.request_id, exc)
            raise InternalError(f"a worker sent an unreadable event for request {self.request_id}") from exc
        return event if event.id == self.request_id else None

    async def _fill_from_journal(self) -> None:
        with redis_unavailable(self._broker.settings.retry_after_s):
            entries = await self._broker.redis.xrange(keys.journal_stream(self.model, self.request_id))
        field = keys.JOURNAL_EVENT_FIELD.encode()
        for _entry_id, fields in entries:
            event = self._decode(fields.get(field, b""))
            if event is not None and event.seq >= self._expected:
                self._pending.setdefault(event.seq, event)
        log.info("refilled %s from its journal (%d entries)", self.request_id, len(entries))
