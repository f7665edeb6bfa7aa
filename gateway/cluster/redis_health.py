"""Whether Redis answers, as one gateway process sees it: a PING every PROBE_EVERY_S from a thread of its own (its
verdict does not depend on how busy the event loop is), and the Redis errors that requests ran into.

Two questions are answered from it:
- `down`: no PING answered for DOWN_AFTER_S. A request arriving then gets a 503 with Retry-After at once, and
  one whose admission is waiting on Redis when it goes down gets it then (a paused Redis accepts connections
  and never replies: without this, requests hang on it).
- `recently_failed(grace_s)`: Redis failed (a probe, or any error noted with `note_error`) within `grace_s`. The
  worker registry read in that window proves nothing: every worker's registry entry may have expired while
  Redis was paused, or gone with a Redis that restarted empty, and they are written again within a moment of
  Redis answering. Admission then queues a request instead of answering 503 no_worker_available.
Without a probe (`ping` None: a client injected by a test), Redis is never `down`; noted errors still count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from redis.exceptions import RedisError

log = logging.getLogger(__name__)
PROBE_EVERY_S = 0.2
DOWN_AFTER_S = 0.8  # no PING answered for this long: Redis is unreachable (fast 503s); also the probe's timeout
LOST_AFTER_S = 20.0  # no PING answered for this long: streams waiting on events end with a 503 (see `lost`)


class RedisHealth:
    """The probe thread and the time of the last Redis failure this gateway saw."""

    def __init__(self, ping: Callable[[], object] | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_recovered: Callable[[], None] | None = None) -> None:
        self._ping = ping  # a blocking PING with a socket timeout of DOWN_AFTER_S
        self.on_recovered = on_recovered  # called on the event loop when Redis answers again after failing
        self._clock = clock
        self._answered_at = clock()
        self._failed_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._went_down = asyncio.Event()

    @property
    def probing(self) -> bool:
        """Whether the probe runs (without one, Redis is never found down)."""
        return self._thread is not None

    @property
    def down(self) -> bool:
        """True while the probe has had no PING answered for DOWN_AFTER_S."""
        return self._thread is not None and self._clock() - self._answered_at > DOWN_AFTER_S

    @property
    def lost(self) -> bool:
        """True while no PING was answered for LOST_AFTER_S: a stream waiting on its events gives up then (a
        gateway cut off from Redis by a partition would otherwise hold its clients with keep-alives until the
        request's deadline). Longer than a Redis restart or a short pause, which streams ride out."""
        return self._thread is not None and self._clock() - self._answered_at > LOST_AFTER_S

    def recently_failed(self, grace_s: float) -> bool:
        """Whether Redis failed within the last `grace_s` seconds (or is down now)."""
        return self.down or (self._failed_at is not None and self._clock() - self._failed_at < grace_s)

    def note_error(self) -> None:
        """Record a Redis failure seen elsewhere (a command's error, the pub/sub connection's loss)."""
        self._failed_at = self._clock()

    def note_answer(self) -> None:
        """Record a Redis reply seen elsewhere (on the event loop): Redis answers now, even if the probe, one PING
        timeout behind, has not seen it yet (a readiness check that passed must not be followed by a 503)."""
        was_down = self.down
        self._answered_at = self._clock()
        self._went_down.clear()
        if was_down and self.on_recovered is not None:
            self.on_recovered()

    async def wait_down(self) -> None:
        """Return once the probe finds Redis down (never, without a probe)."""
        await self._went_down.wait()

    async def start(self) -> None:
        """Start probing (with a `ping`)."""
        if self._ping is None:
            return
        self._loop = asyncio.get_running_loop()
        self._answered_at = self._clock()
        self._thread = threading.Thread(target=self._probe, name="llmfleet-redis-health", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop probing."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, DOWN_AFTER_S + 1)

    def _signal(self, down: bool) -> None:
        """Set or clear the went-down event on the event loop's thread; tell `on_recovered` of a recovery."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the gateway is stopping
                self._loop.call_soon_threadsafe(self._went_down.set if down else self._went_down.clear)
                if not down and self.on_recovered is not None:
                    self._loop.call_soon_threadsafe(self.on_recovered)

    def _probe(self) -> None:
        assert self._ping is not None
        failing = False
        while not self._stop.wait(PROBE_EVERY_S):
            try:
                self._ping()
            except (RedisError, OSError) as exc:
                self._failed_at = self._clock()
                if not failing:
                    log.warning("Redis does not answer (%s); requests get 503 while it does not", type(exc).__name__)
                failing = True
                if self.down:
                    self._signal(True)
                continue
            self._answered_at = self._clock()
            if failing:
                log.info("Redis answers again")
                self._signal(False)
            failing = False
