"""Server-sent events: exact bytes `data: {compact json}\n\n` (and `: comment` lines), closed by `data: [DONE]\n\n`
(OpenAI), or `event: {type}\ndata: {compact json}\n\n` with no closing line (Anthropic: named after the type); a
resumable stream's events each start with `id: {n}`, n counting its events from 0 (gateway/replies/resume.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Comment:
    """An SSE comment line (`: text`): clients ignore it; it tells them and proxies the stream is alive.

    One line, no blank line after it: the official SDKs' SSE decoders (openai's, anthropic's) keep the last `id:`
    and dispatch an event with empty data at any blank line once an id was seen, which they then fail to parse as
    JSON; so a comment never ends an event, the next event's own blank line does."""

    text: str

    def encode(self) -> bytes:
        """The comment's bytes."""
        return b": " + self.text.encode("utf-8") + b"\n"


class ClosableChunks(AsyncIterable[dict[str, Any] | Comment], Protocol):
    """Chunks that must be closed whether or not they were read to the end."""

    async def aclose(self) -> None:
        """Release what the chunks hold (and cancel unfinished work)."""


def event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying `payload` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


def named_event(payload: dict[str, Any]) -> bytes:
    """One SSE event named after the payload's `type` (Anthropic's framing)."""
    return b"event: " + str(payload["type"]).encode("ascii") + b"\n" + event(payload)


async def encode(chunks: AsyncIterable[dict[str, Any] | Comment], *, named: bool = False, ids: bool = False,
                 after: int = -1) -> AsyncIterator[bytes]:
    """The SSE bytes of every chunk, then [DONE] (unless named); chunks whose events were already waiting go out
    in one send. With `ids`, event i (0, 1, ...; comments are not events) carries `id: i`, and events up to
    `after` are left out (a resumed stream: its client had them).

    A stream that keeps up gets one send per event; one that falls behind (a loaded gateway) catches up with
    fewer, larger sends, so the cost per token drops exactly when it matters.
    """
    pending: list[bytes] = []
    frame = named_event if named else event
    number = -1
    async for chunk in chunks:
        if isinstance(chunk, Comment):
            pending.append(chunk.encode())
        else:
            number += 1
            if number <= after:
                continue
            pending.append(b"id: %d\n" % number + frame(chunk) if ids else frame(chunk))
        if not getattr(chunks, "buffered", False) and pending:
            yield b"".join(pending)
            pending = []
    if not named:
        pending.append(DONE)
    if pending:
        yield b"".join(pending)


async def warm_task_groups() -> None:
    """Open one anyio task group: anyio imports its asyncio backend at a process's first (20-40 ms here), which the
    app's start pays instead of its first stream's time to first token."""
    async with anyio.create_task_group():
        pass


class SSEResponse(StreamingResponse):
    """A text/event-stream response that always closes its chunks, even when the client goes away."""

    def __init__(self, chunks: ClosableChunks, *, named: bool = False, ids: bool = False, after: int = -1) -> None:
        self._chunks = chunks
        super().__init__(encode(chunks, named=named, ids=ids, after=after), media_type="text/event-stream",
                         headers=HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Unlike Starlette's default for ASGI spec >= 2.4 (notice the client only when a send fails), always
        # watch for the disconnect: a stream can wait long between events, and its work must stop at once.
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    """Send the whole stream, then stop watching for the disconnect."""
                    with contextlib.suppress(OSError, ClientDisconnect):
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._chunks.aclose()
