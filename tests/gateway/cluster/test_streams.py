"""Stream ownership (gateway/cluster/streams.py) on a fake Redis with a hand-set clock: a dead gateway's streams
are cancelled at its last heartbeat + the grace unless resumed, its background ones adopted, a client that left
is cancelled after the grace, each stream is cancelled once, and a slow gateway taken for dead takes its streams
back."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from gateway.cluster.streams import CANCELLED, DONE, NOBODY, StreamRecord, Streams
from shared import keys
from shared.settings import Settings

pytestmark = pytest.mark.anyio
GRACE_S = 10.0


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(stream_id: str, *, background: bool = False) -> StreamRecord:
    return StreamRecord(stream_id=stream_id, api="chat", body={"model": "m"}, request_id="req-" + stream_id,
                        job_ids=["req-" + stream_id], model="m", created=1000.0, deadline=1600.0, key=None,
                        background=background)


@pytest.fixture
def gateways() -> tuple[Streams, Streams, Clock, list[tuple[str, str]], fakeredis.FakeAsyncRedis]:
    """Two gateways' Streams on one fake Redis and clock, recording the cancels they publish."""
    redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    clock, cancels = Clock(), []

    async def cancel(request_id: str, model: str, reason: str, deadline: float) -> None:
        cancels.append((request_id, reason))

    settings = Settings(orphan_grace_s=GRACE_S)
    return (Streams(redis, settings, cancel, clock=clock), Streams(redis, settings, cancel, clock=clock), clock,
            cancels, redis)


async def _owner(redis: Any, stream_id: str) -> str:
    return (await redis.hget(keys.stream_record(stream_id), "owner")).decode()


async def test_a_dead_gateways_streams_are_cancelled_at_its_last_heartbeat_plus_the_grace(gateways) -> None:
    a, b, clock, cancels, redis = gateways
    await a._beat()
    await a.open(_record("s1"))
    await a.open(_record("s2"))
    await a.open(_record("bg", background=True))
    adopted: list[str] = []

    async def adopt(record: StreamRecord) -> None:
        adopted.append(record.stream_id)

    b.adopter = adopt
    last_beat = clock.now
    clock.now += 2.0  # a is silent, not yet dead
    await b._beat()
    await b._sweep()
    assert await _owner(redis, "s1") == a.gateway_id
    clock.now = last_beat + 3.0  # past the TTL (2.5 s): dead
    await b._sweep()
    assert await _owner(redis, "s1") == NOBODY
    assert await redis.zscore(keys.ORPHANS, "s1") == last_beat + GRACE_S
    assert await _owner(redis, "bg") == b.gateway_id  # adopted, never orphaned
    await b.claim("s2")  # its client resumed on b
    clock.now = last_beat + GRACE_S - 0.1
    await b._beat()
    await b._sweep()
    assert cancels == []
    clock.now = last_beat + GRACE_S
    await b._beat()
    await b._sweep()
    await b._sweep()  # a second sweep finds nothing more to do
    assert cancels == [("req-s1", "client_gone")]
    assert await _owner(redis, "s1") == CANCELLED and await _owner(redis, "s2") == b.gateway_id
    for task in list(b._adoptions):
        await task
    assert adopted == ["bg"]
    assert await redis.zscore(keys.GATEWAYS_INDEX, a.gateway_id) is None


async def test_a_client_that_left_is_cancelled_after_the_grace_unless_it_resumes(gateways) -> None:
    a, b, clock, cancels, redis = gateways
    await a.open(_record("left"))
    await a.open(_record("back"))
    assert await a.detach("left") and await a.detach("back")  # their jobs run on
    await b.claim("back")
    clock.now += GRACE_S
    await a._sweep()
    assert cancels == [("req-left", "client_gone")]
    assert await a.finish("back") is True and await a.finish("back") is False  # the first to end says so
    assert await _owner(redis, "back") == DONE


async def test_with_no_grace_a_client_that_left_is_cancelled_at_once(gateways) -> None:
    a, _, _, _, redis = gateways
    a.settings = Settings(orphan_grace_s=0.0)
    await a.open(_record("s"))
    assert await a.detach("s") is False  # the caller cancels now
    assert await _owner(redis, "s") == CANCELLED
    assert await redis.zscore(keys.ORPHANS, "s") is None


async def test_a_record_lost_with_redis_is_cancelled_at_once_when_its_client_leaves(gateways) -> None:
    a, _, _, _, redis = gateways
    await a.open(_record("s"))
    await redis.flushall()  # Redis restarted empty
    assert await a.detach("s") is False
    assert await a.load("s") is None


async def test_a_slow_gateway_taken_for_dead_takes_its_streams_back(gateways) -> None:
    a, b, clock, cancels, redis = gateways
    await a._beat()
    await a.open(_record("s"))
    clock.now += 3.0
    await b._beat()
    await b._sweep()  # a missed its heartbeats: its stream is an orphan
    assert await _owner(redis, "s") == NOBODY
    await a._beat()  # a was only slow: its client still reads the stream
    assert await _owner(redis, "s") == a.gateway_id
    clock.now += GRACE_S
    await a._beat()
    await b._beat()
    await b._sweep()
    assert cancels == []


async def test_a_records_reply_format_is_read_back_and_an_older_gateways_record_too(gateways) -> None:
    """The format noted once the job was admitted ("default" is not written); a record an older gateway wrote
    (`opens_thinking` in its JSON, `thinking` 1 in the hash) reads as "opened"."""
    first, _, _, _, redis = gateways
    for stream_id, form in (("s-harmony", "harmony"), ("s-default", "default")):
        await first.open(_record(stream_id))
        await first.note_format(stream_id, form)
        loaded = await first.load(stream_id)
        assert loaded is not None and loaded[0].reply_format == form
    legacy = _record("s-old").encode().replace('"reply_format":"default"', '"opens_thinking":true')
    await redis.hset(keys.stream_record("s-old"), mapping={"record": legacy, "thinking": "1", "owner": "g"})
    loaded = await first.load("s-old")
    assert loaded is not None and loaded[0].reply_format == "opened"
