"""One pub/sub connection per gateway process, fanning messages out to per-request queues.

A dispatcher task reads the shared connection and puts each message's payload into the asyncio queue of
its channel, so a thousand concurrent streams cost a thousand queues, not a thousand connections.
`subscribe` returns only after Redis confirmed the subscription: pub/sub keeps nothing for a late
subscriber, so the gateway must not queue a job before its events channel is live. When the connection
is re-established after a failure, every queue receives RESYNC: events published meanwhile are lost and
must be read back from the request's journal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.errors import Unavailable

log = logging.getLogger(__name__)

RESYNC = object()  # queue item: the connection was lost and re-established; events may be missing

QueueItem = bytes | object


class Subscriber:
    """The gateway process's single pub/sub connection and its dispatcher task."""

    def __init__(self, redis: Redis, *, confirm_timeout_s: float = 5.0, retry_after_s: float = 2.0,
                 on_error: Callable[[], None] | None = None) -> None:
        self._redis = redis
        self._on_error = on_error or (lambda: None)  # told of every failure of the connection
        self._confirm_timeout_s = confirm_timeout_s
        self._retry_after_s = retry_after_s
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._queues: dict[bytes, asyncio.Queue[QueueItem]] = {}
        self._confirmations: dict[bytes, asyncio.Future[None]] = {}
        self._connected = asyncio.Event()
        self._connections = 0
        self._closing = False

    @property
    def active(self) -> int:
        """How many channels currently have a listener."""
        return len(self._queues)

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

    async def subscribe(self, channel: str) -> asyncio.Queue[QueueItem]:
        """Listen on `channel`; returns its queue once Redis confirmed the subscription."""
        if self._pubsub is None:
            raise Unavailable("the gateway is not started", retry_after=self._retry_after_s)
        key = channel.encode()
        queue: asyncio.Queue[QueueItem] = asyncio.Queue()
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[key] = queue
        self._confirmations[key] = confirmed
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancel that lands as the wait ends
            async with asyncio.timeout(self._confirm_timeout_s):
                await self._connected.wait()
            await self._pubsub.subscribe(key)
            async with asyncio.timeout(self._confirm_timeout_s):
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

    async def unsubscribe(self, channel: str) -> None:
        """Stop listening on `channel`; later messages on it are dropped. Never raises on Redis errors."""
        key = channel.encode()
        self._queues.pop(key, None)
        self._confirmations.pop(key, None)
        if self._pubsub is None:
            return
        try:
            await self._pubsub.unsubscribe(key)
        except (RedisError, OSError) as exc:
            log.warning("unsubscribe failed (%s); the connection will drop it on reconnect", type(exc).__name__)

    async def _on_connect(self, _connection: object) -> None:
        self._connections += 1
        if self._connections > 1:
            log.warning("pub/sub connection re-established; resyncing %d streams from journals", len(self._queues))
            for queue in self._queues.values():
                queue.put_nowait(RESYNC)

    async def _run(self) -> None:
        backoff = 0.05
        while not self._closing:
            try:
                await self._pubsub.connect()
                self._pubsub.connection.register_connect_callback(self._on_connect)
                if self._connections == 0:
                    self._connections = 1
                self._connected.set()
                while True:
                    message = await self._pubsub.get_message(timeout=None)
                    backoff = 0.05
                    if message is not None:
                        self._dispatch(message)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                self._connected.clear()
                self._on_error()
                for future in self._confirmations.values():
                    if not future.done():
                        future.set_exception(exc)
                log.warning("pub/sub connection failed (%s); retrying in %.2fs", type(exc).__name__, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel")
        if isinstance(channel, str):
            channel = channel.encode()
        if kind == "message":
            queue = self._queues.get(channel)  # type: ignore[arg-type]
            if queue is not None:
                queue.put_nowait(message["data"])
        elif kind == "subscribe":
            future = self._confirmations.get(channel)  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(None)
