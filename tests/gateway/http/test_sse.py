"""SSE framing: chunks whose events already wait are joined into one send."""

from __future__ import annotations

import asyncio

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

