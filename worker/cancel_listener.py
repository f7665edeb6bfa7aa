"""Listens on the model's cancel channel in a background thread and hands request ids to the loop."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading

from redis import Redis
from redis.exceptions import RedisError

from shared import codec, keys
from shared.codec import WireFormatError
from shared.messages import CancelRequest

log = logging.getLogger(__name__)


class CancelListener:
    """Collects CancelRequests for one model; `drain()` returns the ids seen since the last call."""

    def __init__(self, redis: Redis, model: str) -> None:
        self._pubsub = redis.pubsub(ignore_subscribe_messages=True)
        self._channel = keys.cancel_channel(model)
        self._ids: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancel-listener", daemon=True)

    def start(self) -> None:
        """Subscribe (confirmed) and start listening."""
        self._pubsub.subscribe(self._channel)
        self._pubsub.get_message(timeout=5.0)  # the subscribe confirmation
        self._thread.start()

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

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(timeout=0.2)
            except RedisError as exc:
                log.warning("cancel listener lost Redis: %s", exc)
                self._stop.wait(1.0)
                continue
            if not message or message.get("type") != "message":
                continue
            try:
                notice = codec.decode(message["data"])
            except WireFormatError as exc:
                log.warning("ignoring malformed cancel notice: %s", exc)
                continue
            if isinstance(notice, CancelRequest):
                self._ids.put(notice.id)
