"""worker.serve.job_feeder on a real Redis: a busy worker (some slots held) looks for new jobs with one round trip
and reads only the streams that hold one; with none waiting, it blocks briefly on the streams it has room for
(only those of the classes that outrank its running work when it is full), so a job that outranks the running
work reaches the loop's inbox (and `outranks`) the moment it is written."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
import redis

from shared import codec, keys
from shared.fair_queue import FairJob, queue_fair
from shared.messages import GenerateJob, Sampling
from shared.redis_commands import create_group, run
from worker.schedule.preemption import job_rank
from worker.schedule.sequences import Priority
from worker.serve.job_feeder import JobFeeder

pytestmark = pytest.mark.integration
MODEL = "tiny"
SLOTS = 8


class _CountingRedis:
    """The client, counting the XREADGROUP calls the feeder makes (everything else passes through)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self.reads: list[str] = []

    def xreadgroup(self, group: str, consumer: str, streams: dict[str, str], **kwargs: Any) -> Any:
        self.reads += list(streams)
        return self._client.xreadgroup(group, consumer, streams, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _NoAdapters:
    def sync(self, redis: Any, *, force: bool = False) -> None:
        """No LoRA adapters to follow."""


def _feeder(client: _CountingRedis, settings: Any, held: int, *, outranked: bool = True,
            below_share: bool = True) -> JobFeeder:
    """A feeder whose loop holds `held` slots, of low-priority work (`outranked`) or of the top class; every
    tenant below its share of a class, or none."""
    streams, own = keys.jobs_streams(MODEL), keys.worker_jobs_streams(MODEL, "w1")
    for stream in [*streams, *own]:
        run(client, create_group(stream))
    return JobFeeder(client, settings, model=MODEL, worker_id="w1", streams=streams, own_streams=own,  # type: ignore
                     adapters=_NoAdapters(), free_width=lambda: SLOTS - held, accepting=lambda: True,  # type: ignore
                     holds=lambda _rid: False, ensure_group=lambda: None, journal_ttl_s=60, slots=SLOTS,
                     outranked_width=lambda index: held if outranked and keys.PRIORITY_ORDER[index] != "low" else 0,
                     below_share=lambda _tenant, _priority: below_share)


def _queue(client: redis.Redis, rid: str, priority: str) -> None:
    now = time.time()
    job = GenerateJob(id=rid, model=MODEL, created=now, deadline=now + 60, prompt_token_ids=[5, 6, 7], max_tokens=4,
                      sampling=Sampling(temperature=0.0), priority=priority)  # type: ignore[arg-type]
    client.xadd(keys.jobs_stream(MODEL, priority), {keys.JOB_FIELD: codec.encode_job(job)})


def test_a_full_feeder_running_low_work_waits_only_on_the_classes_that_outrank_it(
        client: redis.Redis, settings: Any) -> None:
    counting = _CountingRedis(client)
    feeder = _feeder(counting, settings, held=SLOTS)  # low-priority work holds every slot
    outranking = {s for s in [*keys.jobs_streams(MODEL), *keys.worker_jobs_streams(MODEL, "w1")] if "@low" not in s}
    feeder.start()
    try:
        time.sleep(0.3)  # nothing there: it waits on the streams of the classes above low, never reads a low one
        assert counting.reads and set(counting.reads) <= outranking
        _queue(client, "waits", "low")  # no slot for it
        _queue(client, "urgent", "normal")
        deadline = time.monotonic() + 5
        while not feeder.outranks(int(Priority.LOW)) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert feeder.outranks(int(Priority.LOW))  # the running step would stop for it
        assert [item.job.id for item in feeder.drain()] == ["urgent"]
        assert set(counting.reads) <= outranking
    finally:
        feeder.stop()


def test_a_busy_feeder_waits_on_no_more_streams_than_it_has_room_for_and_takes_any_new_job(
        client: redis.Redis, settings: Any) -> None:
    counting = _CountingRedis(client)
    feeder = _feeder(counting, settings, held=SLOTS - 3, outranked=False)  # top-class work, 3 slots free
    feeder.start()
    try:
        time.sleep(0.3)  # busy, nothing there: it waits on the 3 highest streams (a read returns one job a stream)
        own, shared = keys.worker_jobs_streams(MODEL, "w1"), keys.jobs_streams(MODEL)
        assert set(counting.reads) == {own[0], shared[0], own[1]}
        _queue(client, "next", "low")  # not waited on, but found by the next look
        deadline = time.monotonic() + 5
        taken: list[str] = []
        while not taken and time.monotonic() < deadline:
            taken = [item.job.id for item in feeder.drain(wait_s=0.05)]
        assert taken == ["next"]
    finally:
        feeder.stop()


def test_an_idle_feeder_still_blocks_on_every_stream(client: redis.Redis, settings: Any) -> None:
    counting = _CountingRedis(client)
    feeder = _feeder(counting, settings, held=0)
    feeder.start()
    try:
        _queue(client, "first", "low")
        deadline = time.monotonic() + 5
        taken: list[str] = []
        while not taken and time.monotonic() < deadline:
            taken = [item.job.id for item in feeder.drain(wait_s=0.1)]
        assert taken == ["first"]
        assert set(keys.jobs_streams(MODEL)) <= set(counting.reads)  # it read every class, as before
    finally:
        feeder.stop()


def test_a_job_whose_taking_timed_out_is_taken_again_at_the_next_reclaim(
        client: redis.Redis, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from worker.serve import job_feeder

    failures = [RedisTimeoutError("Timeout reading from socket")]  # the first owning's reply is lost
    real = job_feeder.take_ownership

    def flaky(*args: Any, **kwargs: Any) -> Any:
        grants = real(*args, **kwargs)  # it ran in Redis
        if failures:
            raise failures.pop()
        return grants

    monkeypatch.setattr(job_feeder, "take_ownership", flaky)
    # the default lease: an entry left pending would otherwise wait that long for XAUTOCLAIM
    feeder = _feeder(_CountingRedis(client), dataclasses.replace(settings, lease_s=30.0), held=0)
    feeder.start()
    try:
        _queue(client, "unlucky", "normal")
        deadline = time.monotonic() + 5
        taken: list[Any] = []
        while not taken and time.monotonic() < deadline:
            taken = feeder.drain(wait_s=0.1)
        assert [item.job.id for item in taken] == ["unlucky"] and not failures
        assert taken[0].grant.epoch == 2  # owned again: the epoch of the lost reply is fenced off
    finally:
        feeder.stop()


class _LosingRedis(_CountingRedis):
    """The client, but the first XREADGROUP that gets entries loses its reply (it ran in Redis: the entries are
    pending for this consumer now) as a read that timed out across a Redis pause does."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.lost: list[str] = []

    def xreadgroup(self, group: str, consumer: str, streams: dict[str, str], **kwargs: Any) -> Any:
        from redis.exceptions import TimeoutError as RedisTimeoutError

        reply = super().xreadgroup(group, consumer, streams, **kwargs)
        if reply and not self.lost:
            self.lost = [mid.decode() for _stream, messages in reply for mid, _fields in messages]
            raise RedisTimeoutError("Timeout reading from socket")
        return reply


def test_a_job_whose_read_lost_its_reply_is_taken_well_before_the_lease(
        client: redis.Redis, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.failover import takeover

    monkeypatch.setattr(takeover, "LOST_READ_AFTER_S", 1.0)  # the real bound: the socket timeout + 1 s
    losing = _LosingRedis(client)
    # the only worker of its model, the default lease: before, the entry waited that long for XAUTOCLAIM
    feeder = _feeder(losing, dataclasses.replace(settings, lease_s=30.0), held=0)
    feeder.start()
    try:
        _queue(client, "unlucky", "normal")
        started, taken = time.monotonic(), []
        while not taken and time.monotonic() - started < 6:
            taken = feeder.drain(wait_s=0.1)
        waited = time.monotonic() - started
        assert [item.job.id for item in taken] == ["unlucky"] and losing.lost == [taken[0].message_id]
        assert 1.0 <= waited < 6  # not before the bound (a reply might still come), not after the lease
        assert taken[0].grant.epoch == 1 and taken[0].grant.deliveries == 2  # first owned now; read twice
    finally:
        feeder.stop()


def test_another_workers_stream_gone_since_the_plan_reads_as_empty_and_an_own_one_is_recreated(
        client: redis.Redis, settings: Any) -> None:
    from redis.exceptions import ResponseError

    feeder = _feeder(_CountingRedis(client), settings, held=0)
    gone = keys.worker_jobs_stream(MODEL, "forgotten", "normal")  # a live worker forgot its dead owner's streams
    feeder.stealer.plan = lambda free: {"normal": [(gone, free)]}  # type: ignore[method-assign]
    feeder.stealer.due = lambda: True  # type: ignore[method-assign]
    _queue(client, "placed", "normal")
    feeder._intake()  # no NOGROUP: the job in the shared stream is taken, the vanished stream skipped
    assert [item.job.id for item in feeder.drain()] == ["placed"]
    client.delete(feeder.own_streams[0])
    with pytest.raises(ResponseError, match="NOGROUP"):  # its own: the run loop recreates it
        feeder._read(feeder.own_streams[0], 1, elsewhere=False)


@pytest.mark.parametrize("below_share", [True, False])
def test_a_newcomer_from_the_lane_outranks_its_class_while_its_tenant_is_below_its_share(
        client: redis.Redis, settings: Any, below_share: bool) -> None:
    """A full worker of normal work takes a newcomer the fair queue sent up to the high stream; it stops the running
    step only while its tenant is below its share, and the tenant's untaken count goes back to none."""
    feeder = _feeder(_CountingRedis(client), settings, held=SLOTS, below_share=below_share)
    now = time.time()
    job = GenerateJob(id="b0", model=MODEL, created=now, deadline=now + 60, prompt_token_ids=[5, 6, 7], max_tokens=4,
                      sampling=Sampling(temperature=0.0))
    pipe = client.pipeline()
    queue_fair(pipe, MODEL, "normal", FairJob("b0", codec.encode_job(job), "B", 10, 1, 60), maxlen=100, full=True)
    pipe.execute()
    assert client.hget(keys.fair_lane_keys(MODEL)[0], "B") == b"1"
    feeder.start()
    try:
        deadline = time.monotonic() + 5
        while not feeder._inbox and time.monotonic() < deadline:
            time.sleep(0.005)
        assert feeder.outranks(job_rank(Priority.NORMAL, False)) is below_share
        (item,) = feeder.drain()
        assert (item.job.id, item.tenant, item.newcomer) == ("b0", "B", True)
        assert client.hget(keys.fair_lane_keys(MODEL)[0], "B") is None  # counted taken
    finally:
        feeder.stop()
