"""One pub/sub connection per gateway process, fanning messages out to per-request queues.

A dispatcher task reads the shared connection and puts each message's payload into the asyncio queue of
its channel, so a thousand concurrent streams cost a thousand queues, not a thousand connections.
`subscribe` returns only after Redis confirmed the subscription: pub/sub keeps nothing for a late
subscriber, so the gateway must not queue a job before its events channel is live.

The connection is watched: a PING goes out whenever it was quiet for PING_EVERY_S, and one unanswered for
DEAD_AFTER_S (a partition drops packets without a reset, so the socket itself never fails; a Redis restarted
behind a NAT or a proxy may not reset it either) makes the dispatcher drop the connection and dial again. The
health probe (redis_health.py) calls `check_now` when Redis answers again after an outage: a wait between
dials ends at once and an outstanding PING gets RECOVERY_GRACE_S more. The other way round, the connection tells
`on_answer` whenever Redis delivered on it (a dial, a message, a PONG): Redis answers now, although the probe,
one PING timeout behind after a pause, may not have seen it yet (requests arriving then are admitted, not
refused with "Redis does not answer"). After every re-dial each channel is
subscribed again, and once Redis confirms it its queue receives RESYNC: events published while it was not
subscribed are lost from pub/sub and must be read back from the request's journal (read after the
confirmation, the journal and the channel together miss nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.errors import Unavailable

log = logging.getLogger(__name__)

RESYNC = object()  # queue item: the channel was subscribed again after a lost connection; events may be missing
PING_EVERY_S = 1.0  # a connection quiet this long gets a PING
DEAD_AFTER_S = 4.0  # a PING unanswered this long: the connection is dead, dial again
RECOVERY_GRACE_S = 1.0  # after the health probe saw Redis answer again, an outstanding PING gets this long
MAX_BACKOFF_S = 2.0

QueueItem = bytes | object


class StaleConnection(RedisError):
    """The pub/sub connection did not answer a PING in time."""


class Subscriber:
    """The gateway process's single pub/sub connection, its dispatcher task and the connection's watchdog."""

    def __init__(self, redis: Redis, *, confirm_timeout_s: float = 5.0, retry_after_s: float = 2.0,
                 on_error: Callable[[], None] | None = None, ping_every_s: float = PING_EVERY_S,
                 dead_after_s: float = DEAD_AFTER_S, on_answer: Callable[[], None] | None = None,
                 sharded: bool = False) -> None:
        self._redis = redis
        self._sharded = sharded  # SSUBSCRIBE (one node of a Redis Cluster: gateway/cluster/sharded_subscriber.py)
        self._on_error = on_error or (lambda: None)  # told of every failure of the connection
        self._on_answer = on_answer or (lambda: None)  # told whenever Redis delivered on it (it answers now)
        self._confirm_timeout_s = confirm_timeout_s
        self._retry_after_s = retry_after_s
        self._ping_every_s = ping_every_s
        self._dead_after_s = dead_after_s
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._queues: dict[bytes, asyncio.Queue[QueueItem]] = {}
        self._confirmations: dict[bytes, asyncio.Future[None]] = {}
        self._taps: dict[bytes, list[asyncio.Queue[QueueItem]]] = {}  # more listeners of a channel (a resumed stream)
        self._connected = asyncio.Event()
        self._wake = asyncio.Event()  # check_now was called
        self._heard_at = 0.0  # loop time the connection last delivered anything (a message, a reply, a PONG)
        self._ping_deadline: float | None = None  # loop time by which the outstanding PING must be answered
        self._closing = False
        self.reconnects = 0  # how many times the connection was dropped and dialled again

    @property
    def active(self) -> int:
        """How many channels currently have a listener."""
        return len(self._queues)

    def listens_to(self, channel: str) -> bool:
        """Whether `channel` has a listener here."""
        return channel.encode() in self._queues

    @property
    def connected(self) -> bool:
        """Whether the connection is up now (between dials it is not)."""
        return self._connected.is_set()

    def listeners(self, channel: str) -> list[asyncio.Queue[QueueItem]]:
        """Every queue listening on `channel` here, its main one first."""
        key = channel.encode()
        main = self._queues.get(key)
        return [] if main is None else [main, *self._taps.get(key, ())]

    async def start(self) -> None:
        """Start the dispatcher; it connects (and reconnects) in the background."""
        self._pubsub = self._redis.pubsub()
        self._task = asyncio.create_task(self._run(), name="llmfleet-subscriber")

    async def close(self) -> None:
        """Stop the dispatcher and drop the connection."""
        self._closing = True
        if self._task is not None:
            # redis-py can swallow a cancel that lands while it connects, so repeat until the task is gone.
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=0.01)
            self._task = None
        if self._pubsub is not None:
            await self._pubsub.aclose()
            self._pubsub = None
        for future in self._confirmations.values():
            future.cancel()
        self._confirmations.clear()
        self._queues.clear()
        self._taps.clear()

    def check_now(self) -> None:
        """Redis answers again after an outage (the health probe saw it): dial at once if between dials, and
        give an outstanding PING only RECOVERY_GRACE_S more (a connection that lived through the outage and
        still answers nothing is stale)."""
        self._wake.set()
        if self._ping_deadline is not None:
            now = asyncio.get_running_loop().time()
            self._ping_deadline = min(self._ping_deadline, now + RECOVERY_GRACE_S)

    async def subscribe(self, channel: str, queue: asyncio.Queue[QueueItem] | None = None) -> asyncio.Queue[QueueItem]:
        """Listen on `channel` (into `queue`, a new one unless given); returns the queue once Redis confirmed the
        subscription."""
        if self._pubsub is None:
            raise Unavailable("the gateway is not started", retry_after=self._retry_after_s)
        key = channel.encode()
        queue = queue if queue is not None else asyncio.Queue()
        if key in self._queues and key not in self._confirmations:  # already listened to here: one more listener
            self._taps.setdefault(key, []).append(queue)
            return queue
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[key] = queue
        self._confirmations[key] = confirmed
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancel that lands as the wait ends
            async with asyncio.timeout(self._confirm_timeout_s):
                await self._connected.wait()
                # on a stale connection the send itself may never finish
                await (self._pubsub.ssubscribe(key) if self._sharded else self._pubsub.subscribe(key))
                await asyncio.shield(confirmed)
        except (TimeoutError, RedisError, OSError) as exc:
            await self.unsubscribe(channel)
            raise Unavailable(
                f"cannot subscribe to the events channel ({type(exc).__name__})", retry_after=self._retry_after_s
            ) from exc
        except BaseException:
            await self.unsubscribe(channel)
            raise
        finally:
            self._confirmations.pop(key, None)
        return queue

    async def unsubscribe(self, channel: str, queue: asyncio.Queue[QueueItem] | None = None) -> None:
        """Stop listening on `channel` (only as `queue`, when the channel has other listeners); later messages on it
        are dropped. Never raises on Redis errors."""
        key = channel.encode()
        taps = self._taps.get(key, [])
        if queue is not None and queue in taps:
            taps.remove(queue)
            return
        if queue is not None and taps and self._queues.get(key) is queue:
            self._queues[key] = taps.pop(0)
            return
        self._taps.pop(key, None)
        self._queues.pop(key, None)
        self._confirmations.pop(key, None)
        if self._pubsub is None:
            return
        if not self._connected.is_set():  # between dials: only forget it, so that the next dial skips it
            self._channels().pop(key, None)
            return
        try:
            async with asyncio.timeout(self._confirm_timeout_s):
                await self._unsubscribe(key)
        except (TimeoutError, RedisError, OSError) as exc:
            log.warning("unsubscribe failed (%s); the next dial drops the channel", type(exc).__name__)
            self._channels().pop(key, None)

    def _channels(self) -> dict[bytes, Any]:
        """The channels redis-py subscribes again at each dial."""
        return self._pubsub.shard_channels if self._sharded else self._pubsub.channels

    async def _unsubscribe(self, *keys: bytes) -> None:
        await (self._pubsub.sunsubscribe(*keys) if self._sharded else self._pubsub.unsubscribe(*keys))

    async def _run(self) -> None:
        backoff = 0.05
        while not self._closing:
            try:
                await self._connect()
                backoff = 0.05
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the dispatcher must outlive any failure of its connection
                self._connected.clear()  # subscriptions under way are sent again by the next dial (or time out)
                self._on_error()
                expected = isinstance(exc, RedisError | OSError | TimeoutError)  # uvloop: RuntimeError on a closed
                log.warning("pub/sub connection failed (%s); dialling again in %.2fs", type(exc).__name__, backoff,
                            exc_info=not expected)
                await self._drop()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff):
                        await self._wake.wait()
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _connect(self) -> None:
        """Dial (redis-py subscribes every channel it knows again as it connects) and drop the channels that
        lost their listener meanwhile."""
        first = self._pubsub.connection is None
        async with asyncio.timeout(self._confirm_timeout_s):  # a Redis that accepts and never answers
            await self._pubsub.connect()
            stale = [channel for channel in self._channels() if channel not in self._queues]
            if stale:
                await self._unsubscribe(*stale)
        if not first:
            self.reconnects += 1
            log.warning("pub/sub connection re-established; resyncing %d streams from journals", len(self._queues))
            # the pool's idle connections lived through the same outage and may be as dead (a reset lost in a
            # partition): closed now, the journal reads that follow dial afresh
            with contextlib.suppress(Exception):  # best effort: a connection not closed now fails and is redialled
                async with asyncio.timeout(self._confirm_timeout_s):
                    await self._redis.connection_pool.disconnect(inuse_connections=False)
        self._heard_at = asyncio.get_running_loop().time()
        self._ping_deadline = None
        self._connected.set()
        self._on_answer()

    async def _watch(self) -> None:
        """Read the connection until it fails or a PING goes unanswered; PING it whenever it is quiet."""
        reader = asyncio.create_task(self._read(), name="llmfleet-subscriber-reader")
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._wake.clear()
                await asyncio.wait({reader}, timeout=self._ping_every_s / 4)
                if reader.done():
                    reader.result()  # raises what ended it
                    raise StaleConnection("the pub/sub reader stopped")
                now = loop.time()
                if self._ping_deadline is not None and now > self._ping_deadline:
                    raise StaleConnection(f"no PING reply in {self._dead_after_s:.0f}s")
                if self._ping_deadline is None and now - self._heard_at >= self._ping_every_s:
                    self._ping_deadline = now + self._dead_after_s
                    async with asyncio.timeout(self._dead_after_s):
                        await self._pubsub.ping()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                await reader

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # in slices: a blocking read (timeout None) falls back to the pool's socket timeout in redis-py 5/6,
            # which would drop a quiet healthy connection; None back means nothing came in the slice
            message = await self._pubsub.get_message(timeout=self._ping_every_s)
            if message is None:
                continue
            self._heard_at = loop.time()
            self._ping_deadline = None
            self._on_answer()
            self._dispatch(message)

    async def _drop(self) -> None:
        """Close the connection's socket (a stale one would otherwise be read again); the next dial opens a new one."""
        connection = self._pubsub.connection if self._pubsub is not None else None
        if connection is not None:
            with contextlib.suppress(Exception):  # already closed, or closed under it (uvloop: RuntimeError)
                await connection.disconnect(nowait=True)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel")
        if isinstance(channel, str):
            channel = channel.encode()
        if kind in ("message", "smessage"):
            queue = self._queues.get(channel)  # type: ignore[arg-type]
            if queue is not None:
                queue.put_nowait(message["data"])
                for tap in self._taps.get(channel, ()):  # type: ignore[call-overload]
                    tap.put_nowait(message["data"])
        elif kind in ("subscribe", "ssubscribe"):
            future = self._confirmations.get(channel)  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(None)
            elif (queue := self._queues.get(channel)) is not None:  # type: ignore[arg-type]
                for listener in (queue, *self._taps.get(channel, ())):  # type: ignore[call-overload]
                    listener.put_nowait(RESYNC)  # subscribed again after a lost connection: read the journal
