"""Cancels of one model's requests, found two ways by a background thread and handed to the loop.

- fast path: the model's cancel channel (pub/sub), which a gateway publishes on when a client goes away;
- safety net: the cancel marker (`llmfleet:{model}:cancelled:{id}`, set with a TTL before every publish) of every
  job this worker holds, read with one MGET every MARKER_POLL_S (one slot on a Redis Cluster: the model's hash
  tag). Pub/sub keeps nothing for a subscriber that was disconnected (a Redis restart, a network blip), and a
  cancel may be published while the job is being taken (read, not yet held): the next poll finds its marker. Neither check runs on the decode step's path.
The worker also checks the marker when it takes a job (worker/serve/runner.py), so a job cancelled while it waited
never starts.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError

from shared import codec, keys
from shared.codec import WireFormatError
from shared.messages import CancelRequest
from shared.redis_commands import sharded

log = logging.getLogger(__name__)
MARKER_POLL_S = 0.1  # how often the markers of the held jobs are read (one MGET)


class CancelListener:
    """Collects cancelled request ids for one model; `drain()` returns the ids seen since the last call."""

    def __init__(self, redis: Redis, model: str, held: Callable[[], list[str]] | None = None) -> None:
        self._redis = redis
        self._pubsub = redis.pubsub(ignore_subscribe_messages=True)  # a ClusterPubSub on a Redis Cluster
        self._sharded = sharded(redis)
        self._model = model
        self._channel = keys.cancel_channel(model)
        self._held = held or list  # the request ids this worker holds (their markers are polled)
        self._ids: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancel-listener", daemon=True)
        self._last_poll = 0.0

    def start(self) -> None:
        """Subscribe (confirmed) and start listening (SSUBSCRIBE on a Redis Cluster: the channel is sharded)."""
        if self._sharded:
            self._pubsub.ssubscribe(self._channel)
        else:
            self._pubsub.subscribe(self._channel)
        self._next_message(timeout=5.0)  # the subscribe confirmation
        self._thread.start()

    def _next_message(self, timeout: float) -> dict | None:
        if self._sharded:
            return self._pubsub.get_sharded_message(timeout=timeout)
        return self._pubsub.get_message(timeout=timeout)

    def drain(self) -> list[str]:
        """Request ids cancelled since the last drain."""
        ids = []
        while True:
            try:
                ids.append(self._ids.get_nowait())
            except queue.Empty:
                return ids

    def stop(self) -> None:
        """Stop listening."""
        self._stop.set()
        self._thread.join(timeout=2)
        with contextlib.suppress(RedisError):
            self._pubsub.close()

    def poll_markers(self) -> list[str]:
        """The held request ids whose cancel marker is set (one MGET); they are queued for the loop too."""
        held = self._held()
        if not held:
            return []
        values = self._redis.mget([keys.cancelled_marker(self._model, request_id) for request_id in held])
        cancelled = [request_id for request_id, value in zip(held, values, strict=True) if value is not None]
        for request_id in cancelled:
            self._ids.put(request_id)
        return cancelled

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._next_message(timeout=MARKER_POLL_S)
                if time.monotonic() - self._last_poll >= MARKER_POLL_S:
                    self._last_poll = time.monotonic()
                    self.poll_markers()
            except RedisError as exc:
                log.warning("cancel listener lost Redis: %s", exc)
                self._stop.wait(0.2)
                continue
            if not message or message.get("type") not in ("message", "smessage"):
                continue
            try:
                notice = codec.decode(message["data"])
            except WireFormatError as exc:
                log.warning("ignoring malformed cancel notice: %s", exc)
                continue
            if isinstance(notice, CancelRequest):
                self._ids.put(notice.id)
