"""Admission's view of a queue: one read shared by concurrent requests, reused briefly, plus own jobs since."""

from __future__ import annotations

import asyncio

import pytest

from gateway.cluster.queue_view import QueueState, QueueView

pytestmark = pytest.mark.anyio


class Reads:
    """A stand-in for the Redis read: counts calls, answers after a moment with what it is set to."""

    def __init__(self) -> None:
        self.calls = 0
        self.state = QueueState(3, 2, {"w1": 1}, {"w1": 2})
        self.error: Exception | None = None

    async def __call__(self, model: str) -> QueueState:
        self.calls += 1
        await asyncio.sleep(0.01)
        if self.error is not None:
            raise self.error
        return self.state


async def test_concurrent_requests_share_one_read_and_reuse_it_briefly() -> None:
    now = [100.0]
    reads = Reads()
    view = QueueView(reads, max_age_s=0.1, clock=lambda: now[0])
    states = await asyncio.gather(*(view.state("m") for _ in range(50)))
    assert reads.calls == 1 and all(s == (3, 2, {"w1": 1}, {"w1": 2}) for s in states)
    now[0] += 0.05
    assert await view.state("m") == (3, 2, {"w1": 1}, {"w1": 2}) and reads.calls == 1
    now[0] += 0.1
    await view.state("m")
    assert reads.calls == 2


async def test_own_jobs_queued_after_the_read_are_counted_until_the_next_one() -> None:
    now = [0.0]
    reads = Reads()
    view = QueueView(reads, max_age_s=0.1, clock=lambda: now[0])
    await view.state("m")
    view.note_queued("m", "w2")
    view.note_queued("m", None)
    view.note_queued("other", None)
    assert await view.state("m") == (5, 2, {"w1": 1, "w2": 1}, {"w1": 2})
    now[0] += 0.2
    reads.state = QueueState(5, 2, {"w1": 1, "w2": 1}, {"w1": 2})  # the next read sees them itself
    assert await view.state("m") == (5, 2, {"w1": 1, "w2": 1}, {"w1": 2})


async def test_a_failed_read_fails_every_waiter_and_is_not_kept() -> None:
    reads = Reads()
    reads.error = ConnectionError("down")
    view = QueueView(reads, max_age_s=0.1)
    results = await asyncio.gather(*(view.state("m") for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results) and reads.calls == 1
    reads.error = None
    assert await view.state("m") == (3, 2, {"w1": 1}, {"w1": 2}) and reads.calls == 2


async def test_with_no_reuse_every_request_reads_unless_one_is_under_way() -> None:
    reads = Reads()
    view = QueueView(reads, max_age_s=0.0)
    await view.state("m")
    await view.state("m")
    assert reads.calls == 2
