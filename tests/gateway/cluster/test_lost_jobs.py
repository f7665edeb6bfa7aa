"""A job that a Redis failover lost before a worker took it (asynchronous replication: the promoted replica never
got the XADD) is written again when the gateway's pub/sub connection comes back; one still there is left alone."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.cluster.subscriber import RESYNC
from shared import keys
from shared.messages import GenerateJob

pytestmark = pytest.mark.anyio
MODEL = "smollm2"


def _job(request_id: str) -> GenerateJob:
    now = time.time()
    return GenerateJob(id=request_id, model=MODEL, created=now, deadline=now + 30, prompt="x", max_tokens=2)


async def _entries(redis) -> list[tuple[str, bytes]]:
    """(stream, entry id) of every job in the model's shared streams."""
    return [(s, entry_id) for s in keys.jobs_streams(MODEL) for entry_id, _ in await redis.xrange(s)]


async def test_a_job_lost_by_a_failover_is_queued_again_and_served(app_client, worker, redis) -> None:
    app, _ = app_client
    stream = await app.state.broker.submit(_job("lost-1"))
    [(name, entry_id)] = await _entries(redis)
    await redis.xdel(name, entry_id)  # the replica Sentinel promoted never received the XADD
    stream._queue.put_nowait(RESYNC)  # as the subscriber does once it dialled the new primary
    first = asyncio.create_task(stream.__anext__())
    taken = await worker.take()
    assert taken.id == "lost-1"
    await worker.answer(taken, ["a"])
    assert (await asyncio.wait_for(first, 5)).seq == 0
    await stream.close()


async def test_a_job_still_in_its_stream_is_not_queued_twice(app_client, worker, redis) -> None:
    app, _ = app_client
    stream = await app.state.broker.submit(_job("kept-1"))
    stream._queue.put_nowait(RESYNC)
    waiting = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0.2)
    assert len(await _entries(redis)) == 1
    waiting.cancel()
    await stream.close()
