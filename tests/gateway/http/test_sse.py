"""SSE framing: chunks whose events already wait are joined into one send; keep-alive comments the official
clients read."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.http import sse


class Waiting:
    """Three chunks; the first two report that the next one is already here."""

    def __init__(self) -> None:
        self.left = [{"n": 1}, {"n": 2}, {"n": 3}]

    @property
    def buffered(self) -> bool:
        return len(self.left) > 1

    def __aiter__(self) -> Waiting:
        return self

    async def __anext__(self) -> dict:
        if not self.left:
            raise StopAsyncIteration
        return self.left.pop(0)


def test_chunks_already_waiting_go_out_in_one_send() -> None:
    async def sends() -> list[bytes]:
        return [part async for part in sse.encode(Waiting())]

    assert asyncio.run(sends()) == [b'data: {"n":1}\n\ndata: {"n":2}\n\n', b'data: {"n":3}\n\n', b"data: [DONE]\n\n"]



class WithKeepAlives:
    """Events with keep-alive comments between them and at the end (a stream whose worker paused)."""

    def __init__(self) -> None:
        self.left: list[dict | sse.Comment] = [sse.Comment("queued"), {"n": 1}, sse.Comment("keep-alive"),
                                               sse.Comment("keep-alive"), {"n": 2}, sse.Comment("keep-alive")]

    def __aiter__(self) -> WithKeepAlives:
        return self

    async def __anext__(self) -> dict | sse.Comment:
        if not self.left:
            raise StopAsyncIteration
        return self.left.pop(0)


@pytest.mark.parametrize("named", [False, True])
def test_the_official_clients_read_keep_alives_between_numbered_events(named: bool) -> None:
    """openai's and anthropic's SSE decoders keep the last `id:` and dispatch an empty event at a blank line once
    one was seen: a comment must not end with a blank line of its own, or the client fails parsing ''."""
    from anthropic._streaming import SSEDecoder as AnthropicDecoder
    from openai._streaming import SSEDecoder as OpenAIDecoder

    async def body() -> bytes:
        chunks = WithKeepAlives()
        if named:
            chunks.left = [c if isinstance(c, sse.Comment) else {"type": "delta", **c} for c in chunks.left]
        return b"".join([part async for part in sse.encode(chunks, named=named, ids=True)])

    raw = asyncio.run(body())
    for decoder in (OpenAIDecoder(), AnthropicDecoder()):
        events = [event for event in decoder.iter_bytes(iter([raw]))]
        payloads = [event.data for event in events if event.data != "[DONE]"]
        assert [json.loads(data)["n"] for data in payloads] == [1, 2]
        assert [event.id for event in events][:2] == ["0", "1"]
