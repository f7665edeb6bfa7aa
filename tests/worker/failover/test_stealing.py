"""Other workers' per-worker streams against a real Redis: draining dead ones, stealing overdue jobs from live
ones, forgetting dead ones once empty."""

from __future__ import annotations

import time

import pytest
import redis

from shared import keys
from shared.registry import RegistryEntry
from worker.failover.stealing import ensure_group, forget_dead, plan_others, reclaim_streams

pytestmark = pytest.mark.integration
MODEL = "m"


def _member(client: redis.Redis, worker_id: str, *, state: str | None = "ready") -> None:
    """A worker with per-worker streams; state None = its registry entry is gone (dead)."""
    client.sadd(keys.placed_workers(MODEL), worker_id)
    for stream in keys.worker_jobs_streams(MODEL, worker_id):
        ensure_group(client, stream)
    if state is not None:
        now = time.time()
        entry = RegistryEntry(worker_id=worker_id, model=MODEL, slots=4, heartbeat=now, started=now, state=state)
        client.hset(keys.worker_key(worker_id), mapping=entry.to_hash())


def _place(client: redis.Redis, worker_id: str, priority: str = "normal") -> str:
    return client.xadd(keys.worker_jobs_stream(MODEL, worker_id, priority), {keys.JOB_FIELD: b"job"}).decode()


def test_a_dead_workers_jobs_are_planned_at_once_highest_class_first(client: redis.Redis) -> None:
    _member(client, "me")
    _member(client, "dead", state=None)
    _place(client, "dead", "low")
    _place(client, "dead", "critical")
    plan = plan_others(client, MODEL, "me", free=3, steal_after_s=60)
    assert list(plan) == list(keys.PRIORITY_ORDER)  # every class of an orphan is read (the read takes what is there)
    assert plan["critical"] == [(keys.worker_jobs_stream(MODEL, "dead", "critical"), 3)]
    assert plan_others(client, MODEL, "me", free=0, steal_after_s=60) == {}


def test_a_draining_workers_jobs_are_planned_at_once(client: redis.Redis) -> None:
    _member(client, "me")
    _member(client, "leaving", state="draining")
    _place(client, "leaving")
    assert plan_others(client, MODEL, "me", free=2, steal_after_s=60)["normal"] == [
        (keys.worker_jobs_stream(MODEL, "leaving"), 2)]


def test_a_live_workers_jobs_are_stolen_only_once_overdue(client: redis.Redis) -> None:
    _member(client, "me")
    _member(client, "busy")
    stream = keys.worker_jobs_stream(MODEL, "busy")
    _place(client, "busy")
    _place(client, "busy")
    assert plan_others(client, MODEL, "me", free=4, steal_after_s=0.3) == {}  # fresh: its worker gets them
    time.sleep(0.35)
    _place(client, "busy")  # a fresh one behind the overdue two
    assert plan_others(client, MODEL, "me", free=4, steal_after_s=0.3) == {"normal": [(stream, 2)]}
    assert plan_others(client, MODEL, "me", free=1, steal_after_s=0.3) == {"normal": [(stream, 1)]}
    client.xreadgroup(keys.JOBS_GROUP, "busy", {stream: ">"}, count=2)  # its worker read them meanwhile
    assert plan_others(client, MODEL, "me", free=4, steal_after_s=0.3) == {}


def test_a_dead_worker_is_forgotten_only_once_its_streams_hold_nothing(client: redis.Redis) -> None:
    _member(client, "me")
    _member(client, "alive")
    _member(client, "dead", state=None)
    stream = keys.worker_jobs_stream(MODEL, "dead")
    entry = _place(client, "dead")
    assert forget_dead(client, MODEL, "me") == []  # a job waits
    client.xreadgroup(keys.JOBS_GROUP, "me", {stream: ">"}, count=1)
    assert forget_dead(client, MODEL, "me") == []  # a job is pending (taken, not acked)
    client.xack(stream, keys.JOBS_GROUP, entry)
    client.xdel(stream, entry)
    assert forget_dead(client, MODEL, "me") == ["dead"]
    assert not client.exists(*keys.worker_jobs_streams(MODEL, "dead"))
    assert {m.decode() for m in client.smembers(keys.placed_workers(MODEL))} == {"me", "alive"}


def test_a_stream_placed_on_without_a_group_still_blocks_forgetting(client: redis.Redis) -> None:
    client.sadd(keys.placed_workers(MODEL), "dead")
    _place(client, "dead")  # e.g. placed after Redis restarted empty: no group yet
    assert forget_dead(client, MODEL, "me") == []
    plan = plan_others(client, MODEL, "me", free=1, steal_after_s=60)  # the group is created, from id 0
    got = client.xreadgroup(keys.JOBS_GROUP, "me", {plan["normal"][0][0]: ">"}, count=1)
    assert len(got[0][1]) == 1


def test_reclaim_looks_at_shared_and_every_per_worker_stream_by_class(client: redis.Redis) -> None:
    client.sadd(keys.placed_workers(MODEL), "a", "b")
    streams = reclaim_streams(client, MODEL)
    assert streams[:3] == [keys.jobs_stream(MODEL, "critical"), keys.worker_jobs_stream(MODEL, "a", "critical"),
                           keys.worker_jobs_stream(MODEL, "b", "critical")]
    assert len(streams) == 3 * len(keys.PRIORITY_ORDER)
