"""Helpers for worker tests on a real Redis: queue a job the way the gateway does, collect its events."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from shared import codec, keys
from shared.messages import DoneEvent, ErrorEvent


def submit(client: redis.Redis, message: Any) -> Any:
    """Subscribe to the request's events (confirmed), then enqueue on its model's shared stream; returns the pubsub."""
    pubsub = client.pubsub()
    pubsub.subscribe(keys.events_channel(message.model, message.id))
    confirmation = pubsub.get_message(timeout=2)  # wait for Redis to confirm, as the gateway does
    assert confirmation is not None and confirmation["type"] == "subscribe"
    client.xadd(keys.jobs_stream(message.model), {keys.JOB_FIELD: codec.encode_job(message)})
    return pubsub


def collect(pubsub: Any, timeout: float = 30.0) -> list[Any]:
    """The request's events up to and including its terminal one (an AssertionError if none comes in time)."""
    events: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=0.2)
        if msg and msg["type"] == "message":
            events.append(codec.decode_event(msg["data"]))
            if isinstance(events[-1], DoneEvent | ErrorEvent):
                return events
    raise AssertionError(f"no terminal event; got {events}")


def run_until_collected(runner: Any, pubsub: Any, timeout: float = 30.0) -> list[Any]:
    """Run a WorkerRunner in a thread until the request's terminal event is in (collect), then stop it."""
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        return collect(pubsub, timeout=timeout)
    finally:
        runner.stop_requested.set()
        thread.join(timeout=10)
