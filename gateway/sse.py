"""Server-sent events: exact bytes `data: {compact json}\n\n`, closed by `data: [DONE]\n\n`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Protocol

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


class ClosableChunks(AsyncIterable[dict[str, Any]], Protocol):
    """Chunks that must be closed whether or not they were read to the end."""

    async def aclose(self) -> None:
        """Release what the chunks hold (and cancel unfinished work)."""


def event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying `payload` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


async def encode(chunks: AsyncIterable[dict[str, Any]]) -> AsyncIterator[bytes]:
    """The SSE bytes of every chunk, then [DONE]."""
    async for chunk in chunks:
        yield event(chunk)
    yield DONE


class SSEResponse(StreamingResponse):
    """A text/event-stream response that always closes its chunks, even when the client goes away."""

    def __init__(self, chunks: ClosableChunks) -> None:
        self._chunks = chunks
        super().__init__(encode(chunks), media_type="text/event-stream", headers=HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._chunks.aclose()
