"""Resumable streams: what each one renders, which gateway listens to it, and cancelling what nobody listens to.

Every streamed chat, completions, Messages or Responses request has a record, `llmfleet:{streams}:stream:{stream_id}` (the id
its client sees: chatcmpl-..., cmpl-..., msg_..., resp_...), written BEFORE its job is queued: the request body (a
resuming gateway parses it again and renders the same SSE events), its request and job ids, model, created time,
deadline and API key name, and `owner`:
- a gateway id: that gateway's client listens (the id is also in `llmfleet:{streams}:gateway-streams:{gateway_id}`);
- "": nobody listens (the client left, or its gateway died); `llmfleet:{streams}:orphans` holds when its jobs are cancelled;
- "done" / "cancelled": it ended; the record (and the journal) stay LLMFLEET_STREAM_RETENTION_S for late resumes.
A resume (any gateway) takes `owner` and drops the orphan entry, so a resumed stream is never cancelled. Every
gateway heartbeats `llmfleet:gateways` every LLMFLEET_HEARTBEAT_INTERVAL_S and sweeps: a gateway silent for
LLMFLEET_HEARTBEAT_TTL_S is dead, its streams become orphans due at its last heartbeat + LLMFLEET_ORPHAN_GRACE_S
(its background responses are adopted instead: the sweeping gateway follows them to the end and stores them), and
due orphans get their jobs cancelled. Each change of `owner` is one WATCH/MULTI transaction on the record, so two
gateways sweeping at once act once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, WatchError

from gateway.http.redis_errors import redis_unavailable
from shared import keys
from shared.settings import Settings

log = logging.getLogger(__name__)

DONE, CANCELLED, NOBODY = "done", "cancelled", ""
RECORD_MARGIN_S = 60.0
SWEEP_BATCH = 100

Cancel = Callable[[str, str, str, float], Awaitable[None]]  # (request id, model, reason, deadline)
Adopter = Callable[["StreamRecord"], Awaitable[None]]


@dataclass(frozen=True)
class StreamRecord:
    """What a gateway needs to render a stream again: the API, the request as sent, and its job's ids."""

    stream_id: str
    api: str  # "chat", "completion", "anthropic" or "responses"
    body: dict[str, Any]
    request_id: str
    job_ids: list[str]
    model: str
    created: float
    deadline: float
    key: str | None
    background: bool = False
    reply_format: str = field(default="default")  # how the reply is written (gateway/replies/parser.py ReplyFormat)

    def encode(self) -> str:
        """The record as compact JSON."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, raw: bytes | None, reply_format: bytes | None = None) -> StreamRecord | None:
        """A record read back (None when unreadable); `reply_format` is the hash's `format` field, noted once the
        job was admitted (a record an older gateway wrote says `"thinking": "1"` for "opened")."""
        if raw is None:
            return None
        try:
            fields = json.loads(raw)
            if fields.pop("opens_thinking", False):
                fields["reply_format"] = "opened"
            if reply_format is not None:
                fields["reply_format"] = "opened" if reply_format == b"1" else reply_format.decode()
            return cls(**fields)
        except (ValueError, TypeError):
            log.warning("an unreadable stream record was ignored")
            return None


class Streams:
    """This gateway's side of stream ownership: its heartbeat, its streams, and the sweep of dead gateways'."""

    def __init__(self, redis: Redis, settings: Settings, cancel: Cancel, *, clock: Callable[[], float] = time.time
                 ) -> None:
        self.redis = redis
        self.settings = settings
        self.gateway_id = uuid.uuid4().hex[:16]
        self.clock = clock
        self._cancel = cancel
        self._mine: set[str] = set()  # the streams this gateway listens to now
        self._task: asyncio.Task[None] | None = None
        self._adoptions: set[asyncio.Task[None]] = set()
        self.adopter: Adopter | None = None  # follows a dead gateway's background response to its end
        self.on_reaped: dict[str, Callable[[StreamRecord], Awaitable[None]]] = {}  # api -> after its jobs' cancel
        self._beats = 0
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Start heartbeating and sweeping."""
        self._task = asyncio.create_task(self._run(), name="llmfleet-streams")

    async def close(self) -> None:
        """Stop (the heartbeat lapses: other gateways adopt what this one still holds after the grace)."""
        self._stop.set()  # not a cancel: a Redis client may swallow one mid-command
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=6.0)
            self._task.cancel()
        for task in self._adoptions:
            task.cancel()
        await asyncio.gather(*self._adoptions, return_exceptions=True)

    def _ttl(self, deadline: float) -> int:
        left = deadline - self.clock() + self.settings.deadline_grace_s
        return max(1, math.ceil(left + self.settings.stream_retention_s + self.settings.orphan_grace_s
                                + RECORD_MARGIN_S))

    async def open(self, record: StreamRecord) -> None:
        """Write the record, owned by this gateway, before its job is queued (Redis errors are a 503)."""
        key = keys.stream_record(record.stream_id)
        with redis_unavailable(self.settings.retry_after_s):
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(key, mapping={"record": record.encode(), "owner": self.gateway_id,
                                    "background": "1" if record.background else "0"})
            pipe.expire(key, self._ttl(record.deadline))
            pipe.sadd(keys.gateway_streams(self.gateway_id), record.stream_id)
            await pipe.execute()
        self._mine.add(record.stream_id)

    async def note_format(self, stream_id: str, reply_format: str) -> None:
        """Record how the reply is written (known once the job is admitted; "default" is not written)."""
        if reply_format != "default":
            with contextlib.suppress(RedisError, OSError):
                await self.redis.hset(keys.stream_record(stream_id), "format", reply_format)

    async def load(self, stream_id: str) -> tuple[StreamRecord, str] | None:
        """The record and its owner now; None when it is gone."""
        with redis_unavailable(self.settings.retry_after_s):
            raw, form, thinking, owner = await self.redis.hmget(keys.stream_record(stream_id), "record", "format",
                                                                "thinking", "owner")
        record = StreamRecord.decode(raw, form if form is not None else thinking)
        return None if record is None else (record, (owner or b"").decode())

    async def _change(self, stream_id: str, decide: Callable[[str | None], Callable[[Any], None] | None]) -> bool:
        """One owner change: `decide(owner now)` returns what to queue in the MULTI, or None to change nothing."""
        key = keys.stream_record(stream_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.hget(key, "owner")
                    change = decide(None if raw is None else raw.decode())
                    if change is None:
                        await pipe.unwatch()
                        return False
                    pipe.multi()
                    change(pipe)
                    await pipe.execute()
                    return True
                except WatchError:
                    continue

    async def claim(self, stream_id: str) -> None:
        """A client resumed the stream here: this gateway owns it now (unless it ended); Redis errors are a 503."""
        me = self.gateway_id

        def take(owner: str | None) -> Callable[[Any], None] | None:
            if owner is None or owner in (DONE, CANCELLED):
                return None
            return lambda pipe: (pipe.hset(keys.stream_record(stream_id), "owner", me),
                                 pipe.zrem(keys.ORPHANS, stream_id), pipe.sadd(keys.gateway_streams(me), stream_id))

        with redis_unavailable(self.settings.retry_after_s):
            if await self._change(stream_id, take):
                self._mine.add(stream_id)
                log.info("took over stream %s", stream_id)

    async def detach(self, stream_id: str) -> bool:
        """The client left: its jobs run on for LLMFLEET_ORPHAN_GRACE_S, for a resume. False when they must be
        cancelled now (no grace, or Redis did not answer); nothing changes if another gateway owns it."""
        self._mine.discard(stream_id)
        grace = self.settings.orphan_grace_s
        me, due = self.gateway_id, self.clock() + grace
        seen: list[str | None] = []

        def leave(owner: str | None) -> Callable[[Any], None] | None:
            seen.append(owner)
            if owner != me:
                return None
            if grace <= 0:
                return lambda pipe: (pipe.hset(keys.stream_record(stream_id), "owner", CANCELLED),
                                     pipe.srem(keys.gateway_streams(me), stream_id))
            return lambda pipe: (pipe.hset(keys.stream_record(stream_id), "owner", NOBODY),
                                 pipe.zadd(keys.ORPHANS, {stream_id: due}), pipe.srem(keys.gateway_streams(me), stream_id))

        try:
            async with asyncio.timeout(5.0):
                changed = await self._change(stream_id, leave)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not detach stream %s (%s); cancelling it", stream_id, type(exc).__name__)
            return False
        if not changed:  # resumed elsewhere (that gateway owns it now), or ended; a record gone: cancel
            return bool(seen) and seen[-1] is not None
        if grace > 0:
            log.info("stream %s has no listener; its job is cancelled in %.1fs unless resumed", stream_id, grace)
        return grace > 0

    async def finish(self, stream_id: str) -> bool:
        """The stream ended: keep it LLMFLEET_STREAM_RETENTION_S for late resumes. True for the first to say so."""
        self._mine.discard(stream_id)
        key, retention = keys.stream_record(stream_id), self.settings.stream_retention_s

        def end(owner: str | None) -> Callable[[Any], None] | None:
            if owner is None or owner in (DONE, CANCELLED):
                return None
            if retention <= 0:
                return lambda pipe: (pipe.delete(key), pipe.srem(keys.gateway_streams(self.gateway_id), stream_id))
            return lambda pipe: (pipe.hset(key, "owner", DONE), pipe.expire(key, max(1, math.ceil(retention))),
                                 pipe.srem(keys.gateway_streams(self.gateway_id), stream_id))

        try:
            async with asyncio.timeout(5.0):
                return await self._change(stream_id, end)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not mark stream %s ended (%s)", stream_id, type(exc).__name__)
            return False

    async def _run(self) -> None:
        every = self.settings.heartbeat_interval_s
        failing = False
        while not self._stop.is_set():
            try:
                await self._beat()
                await self._sweep()
                failing = False
            except (RedisError, OSError, TimeoutError) as exc:
                if not failing:
                    log.warning("gateway heartbeat failed (%s); retrying", type(exc).__name__)
                failing = True
            except Exception:  # noqa: BLE001 - the sweep must outlive a bug in one pass
                log.exception("stream sweep failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._stop.wait()

    async def _beat(self) -> None:
        """Heartbeat; if others took this gateway for dead, take its listened streams back."""
        async with asyncio.timeout(5.0):
            added = await self.redis.zadd(keys.GATEWAYS_INDEX, {self.gateway_id: self.clock()})
        self._beats += 1
        if added and self._beats > 1 and self._mine:
            log.warning("this gateway was taken for dead; reclaiming %d streams", len(self._mine))
            for stream_id in list(self._mine):
                await self.claim(stream_id)

    async def _sweep(self) -> None:
        now = self.clock()
        dead = await self.redis.zrangebyscore(keys.GATEWAYS_INDEX, "-inf", now - self.settings.heartbeat_ttl_s,
                                              withscores=True)
        for gateway, last in dead:
            if gateway.decode() != self.gateway_id:
                await self._bury(gateway.decode(), float(last))
        due = await self.redis.zrangebyscore(keys.ORPHANS, "-inf", now, start=0, num=SWEEP_BATCH)
        for stream_id in due:
            await self._reap(stream_id.decode())

    async def _bury(self, gateway: str, last_beat: float) -> None:
        """A dead gateway's streams: orphans due at its last heartbeat + the grace; its background ones adopted."""
        held = await self.redis.smembers(keys.gateway_streams(gateway))
        due = last_beat + self.settings.orphan_grace_s
        for raw in held:
            await self._bury_one(gateway, raw.decode(), due)
        # two slots (the gateways index is not the streams' tag): in order, not one MULTI; a sweep that fails between
        # them buries the gateway again next time, with nothing left to bury
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.gateway_streams(gateway))
        pipe.zrem(keys.GATEWAYS_INDEX, gateway)
        await pipe.execute()

    async def _bury_one(self, gateway: str, stream_id: str, due: float) -> None:
        """One stream of a dead gateway: an orphan, or, a background response's, adopted by this gateway."""
        record_key, me = keys.stream_record(stream_id), self.gateway_id
        background = await self.redis.hget(record_key, "background") == b"1"

        def orphan(owner: str | None) -> Callable[[Any], None] | None:
            if owner != gateway:
                return None
            if background:
                return lambda pipe: (pipe.hset(record_key, "owner", me), pipe.sadd(keys.gateway_streams(me), stream_id))
            return lambda pipe: (pipe.hset(record_key, "owner", NOBODY), pipe.zadd(keys.ORPHANS, {stream_id: due}))

        if not await self._change(stream_id, orphan):
            return
        log.info("gateway %s is dead: stream %s %s", gateway, stream_id,
                 "adopted" if background else f"cancelled in {max(0.0, due - self.clock()):.1f}s unless resumed")
        if background:
            self._mine.add(stream_id)
            self._adopt(stream_id)

    def _adopt(self, stream_id: str) -> None:
        async def follow() -> None:
            """Follow the adopted background response to its end."""
            loaded = await self.load(stream_id)
            if loaded is not None and self.adopter is not None:
                await self.adopter(loaded[0])

        task = asyncio.create_task(follow())
        self._adoptions.add(task)
        task.add_done_callback(self._adoptions.discard)

    async def _reap(self, stream_id: str) -> None:
        """A due orphan: cancel its jobs, unless it was resumed meanwhile."""
        record_key = keys.stream_record(stream_id)

        def reap(owner: str | None) -> Callable[[Any], None] | None:
            if owner != NOBODY:
                return None
            return lambda pipe: (pipe.hset(record_key, "owner", CANCELLED), pipe.zrem(keys.ORPHANS, stream_id))

        if not await self._change(stream_id, reap):
            await self.redis.zrem(keys.ORPHANS, stream_id)  # resumed, ended or gone
            return
        loaded = await self.load(stream_id)
        if loaded is None:
            return
        record = loaded[0]
        log.info("stream %s had no listener for the grace time; cancelling its job", stream_id)
        for job_id in record.job_ids:
            await self._cancel(job_id, record.model, "client_gone", record.deadline)
        hook = self.on_reaped.get(record.api)
        if hook is not None:
            await hook(record)
