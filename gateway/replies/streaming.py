"""What every streamed response shares: `: queued` comments, recording an error sent mid-stream, and how a stream
ends: a resumable stream (gateway/cluster/streams.py) whose client went away leaves its job running for
LLMFLEET_ORPHAN_GRACE_S, so that a resume (gateway/replies/resume.py) finds it; one that ended says so, and the
first stream of a request to end charges its API key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio

from gateway.cluster.streams import StreamRecord, Streams
from gateway.http.api_keys import current_key
from gateway.http.error_log import ErrorLog, make_entry
from gateway.http.sse import Comment
from gateway.replies.request_events import CLOSE_TIMEOUT_S, RequestEvents
from shared.errors import LLMFleetError
from shared.messages import GenerateJob


@dataclass(frozen=True)
class StartedStream:
    """A streaming request whose jobs are queued: its first events came, or `priming` still waits for them."""

    request_events: RequestEvents
    request_id: str
    created: float
    priming: asyncio.Task[None] | None
    reply_format: str = "default"  # how the reply is written (gateway/replies/parser.py ReplyFormat)
    stream_id: str | None = None  # a resumable stream's id (its record is written)


def new_record(api: str, stream_id: str, body: dict[str, Any] | None, jobs: list[GenerateJob], *,
               background: bool = False) -> StreamRecord | None:
    """The record that makes a stream resumable; None for one that cannot be (no body, or several prompts: their
    jobs' events interleave differently on every read, so its event numbers would not repeat)."""
    if body is None or len(jobs) != 1:
        return None
    key = current_key.get()
    job = jobs[0]
    return StreamRecord(stream_id=stream_id, api=api, body=body, request_id=job.id, job_ids=[job.id],
                        model=job.model, created=job.created, deadline=job.deadline,
                        key=key.name if key is not None else None, background=background)


async def queued_comments(priming: asyncio.Task[None] | None, keepalive_s: float) -> AsyncIterator[Comment]:
    """`: queued`, then a keep-alive every keepalive_s until the first events came (their error raises)."""
    if priming is None:
        return
    yield Comment("queued")
    while not priming.done():
        await asyncio.wait({priming}, timeout=keepalive_s)
        if not priming.done():
            yield Comment("keep-alive")
    priming.result()


def record_streamed_error(errors: ErrorLog | None, error: LLMFleetError, path: str) -> None:
    """Add an error sent after a stream began to the fleet's recent errors."""
    if errors is None:
        return
    key = current_key.get()
    errors.record(make_entry(status=error.status, type=error.type, code=error.code, param=error.param, streamed=True,
                             path=path, key=key.name if key else None))


class OpenStream:
    """What every streamed response holds: the request's events, the task still waiting for its first
    events while it is queued (the stream then opens with `: queued`), and, when resumable, its record's id."""

    _request_events: RequestEvents
    _priming: asyncio.Task[None] | None
    _streams: Streams | None = None
    _stream_id: str | None = None
    _follower = False  # a background response's reader: the job is not its to cancel, charge or store
    _ended = False  # the last event is on its way: a close before that is a client that went away
    _closed: bool | None = None  # after aclose: whether the job was left running

    def resumable(self, streams: Streams | None, stream_id: str | None, *, follower: bool = False) -> None:
        """Make the stream resumable under `stream_id` (its record is written; None: it is not resumable)."""
        if streams is not None and stream_id is not None:
            self._streams, self._stream_id, self._follower = streams, stream_id, follower

    def ended(self) -> None:
        """Note that the stream sends its last event now (it ends, whatever happens to the client after)."""
        self._ended = True

    async def aclose(self) -> None:
        """Close the request's jobs: cancel them where unfinished, unless the client may resume (then they run
        on for the grace time); idempotent."""
        if self._closed is None:
            self._closed = False
            with anyio.move_on_after(CLOSE_TIMEOUT_S * 2, shield=True):  # runs while its request is being cancelled
                self._closed = await self._close()

    @property
    def stream_id(self) -> str | None:
        """The id a client resumes the stream by (None: not resumable; its events carry no `id:`)."""
        return self._stream_id

    @property
    def detached(self) -> bool:
        """True when the stream closed with its job left running (for a resume, or a background response)."""
        return bool(self._closed)

    async def _close(self) -> bool:
        if self._priming is not None:
            self._priming.cancel()
        if self._streams is None or self._stream_id is None:
            await self._request_events.close()
            return False
        if self._follower:
            await self._request_events.close(cancel=False, charge=False)
            return True
        if self._ended:
            first = await self._streams.finish(self._stream_id)
            await self._request_events.close(charge=first)
            return False
        detached = await self._streams.detach(self._stream_id)
        await self._request_events.close(cancel=not detached, charge=False)
        return detached

    @property
    def buffered(self) -> bool:
        """True when more events already wait, so the SSE writer can join them into one send."""
        return self._request_events.buffered
