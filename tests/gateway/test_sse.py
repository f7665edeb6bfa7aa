"""SSE framing: chunks whose events already wait are joined into one send."""

from __future__ import annotations

import asyncio

from gateway import sse


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


class Slow:
    """Chunks from a generator that waits `pause` before its second one; `buffered` turns True while it waits
    (the event is in the queue before the generator has taken it), as a resumed stream's does."""

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.arrived = False

    @property
    def buffered(self) -> bool:
        return self.arrived

    def __aiter__(self):  # noqa: ANN204
        return self._chunks()

    async def _chunks(self):  # noqa: ANN202
        yield {"n": 1}
        await asyncio.sleep(self.pause * 0.8)
        self.arrived = True
        await asyncio.sleep(self.pause * 0.2)
        self.arrived = False
        yield {"n": 2}


def test_a_stream_that_waits_gets_keep_alive_comments() -> None:
    async def sends() -> list[bytes]:
        return [part async for part in sse.encode(Slow(0.35), keepalive_s=0.1)]

    parts = asyncio.run(sends())
    assert parts[0] == b'data: {"n":1}\n\n' and parts[-2:] == [b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
    assert set(parts[1:-2]) == {sse.KEEPALIVE} and len(parts[1:-2]) >= 2
