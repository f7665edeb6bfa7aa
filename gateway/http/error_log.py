"""Recent errors of the whole fleet, for the dashboard: a capped Redis list every gateway writes to.

Each error a client receives (an HTTP error, or the final error chunk of a stream that had begun) becomes one
small JSON entry: time, model, status, type, code, param, request id, API key name, path, and whether the
stream had begun. Never the error's message or anything of the request's content: a message can quote input.

  LPUSH llmfleet:errors <json>  +  LTRIM llmfleet:errors 0 MAX_ENTRIES-1   (one pipeline, in the background)

Writes are best effort (a Redis failure loses the entry, never fails the request) and throttled per gateway
(at most WRITES_PER_S, so a flood of refused requests cannot turn into a flood of Redis writes).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.http.redis_errors import redis_unavailable
from shared import keys

log = logging.getLogger(__name__)

MAX_ENTRIES = 100
WRITES_PER_S = 20.0
MAX_FIELD_CHARS = 120  # model names and paths come from clients: bounded in every entry
ENTRY_FIELDS = ("time", "model", "status", "type", "code", "param", "request_id", "key", "path", "streamed")


@dataclass
class RequestNote:
    """What is known about the current request when it fails (filled in as the request goes along)."""

    model: str | None = None
    request_id: str | None = None


current_note: contextvars.ContextVar[RequestNote | None] = contextvars.ContextVar("current_note", default=None)


def note_request() -> RequestNote:
    """The current request's note, created on first use in this context."""
    note = current_note.get()
    if note is None:
        note = RequestNote()
        current_note.set(note)
    return note


def _bounded(value: object) -> str | None:
    return None if value is None else str(value)[:MAX_FIELD_CHARS]


def make_entry(*, status: int, type: str, code: str | None, param: str | None = None, path: str | None = None,
               key: str | None = None, streamed: bool = False, note: RequestNote | None = None,
               now: float | None = None) -> dict[str, Any]:
    """One error entry (what the dashboard shows); never any message or request content."""
    note = note if note is not None else current_note.get()
    return {"time": round(time.time() if now is None else now, 3), "model": _bounded(note and note.model),
            "status": int(status), "type": _bounded(type), "code": _bounded(code), "param": _bounded(param),
            "request_id": _bounded(note and note.request_id), "key": _bounded(key), "path": _bounded(path),
            "streamed": bool(streamed)}


def parse_entry(raw: bytes) -> dict[str, Any] | None:
    """An entry read back from Redis, with exactly ENTRY_FIELDS; None when it is not one."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("time"), int | float) \
            or not isinstance(value.get("status"), int):
        return None
    return {name: value.get(name) for name in ENTRY_FIELDS}


class ErrorLog:
    """Writes error entries to the fleet's capped list (throttled, in the background) and reads them back."""

    def __init__(self, redis: Redis, *, retry_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._redis = redis
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._allowance = WRITES_PER_S
        self._last = clock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0  # entries not written because of the throttle

    def record(self, entry: dict[str, Any]) -> None:
        """Queue one entry for writing; returns at once, never raises."""
        now = self._clock()
        self._allowance = min(WRITES_PER_S, self._allowance + (now - self._last) * WRITES_PER_S)
        self._last = now
        if self._allowance < 1:
            self.dropped += 1
            return
        self._allowance -= 1
        try:
            task = asyncio.get_running_loop().create_task(self._write(json.dumps(entry, separators=(",", ":"))))
        except RuntimeError:  # no loop (not inside the app): nothing to write with
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, payload: str) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.lpush(keys.ERRORS_LIST, payload)
            pipe.ltrim(keys.ERRORS_LIST, 0, MAX_ENTRIES - 1)
            await pipe.execute()
        except (RedisError, OSError) as exc:
            log.debug("could not record an error entry (%s)", type(exc).__name__)

    async def recent(self, limit: int = MAX_ENTRIES) -> list[dict[str, Any]]:
        """The newest entries first (at most `limit`); a 503 Unavailable when Redis is away."""
        with redis_unavailable(self._retry_after_s):
            raw = await self._redis.lrange(keys.ERRORS_LIST, 0, max(0, limit - 1))
        return [entry for entry in map(parse_entry, raw) if entry is not None]

    async def flush(self) -> None:
        """Wait for the writes under way (tests, shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
