"""shared/redis_commands.py: each rule gives the same answer run on the sync and on the asyncio client
(fakeredis, one server behind both); the queue-depth rule over shared and placed streams, consumer groups
created once, fresh registry entries, and journal-then-publish."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import keys
from shared.redis_commands import (
    QueueState,
    create_group,
    describe_refusal,
    fresh_workers,
    queue_event,
    queue_job_done,
    queue_states,
    run,
    run_async,
    streams_with_waiting,
    write_refusal,
)
from shared.registry import RegistryEntry


@pytest.fixture()
def clients() -> tuple[fakeredis.FakeRedis, fakeredis.aioredis.FakeRedis]:
    """A sync and an asyncio client of one fake server."""
    server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=server), fakeredis.aioredis.FakeRedis(server=server)


def both(clients: tuple[Any, Any], rule: Any, *args: Any, **kwargs: Any) -> Any:
    """Run the rule on both clients; the answers must agree (the sync one is returned)."""
    sync, aio = clients
    answer = run(sync, rule(*args, **kwargs))
    assert asyncio.run(run_async(aio, rule(*args, **kwargs))) == answer
    return answer


def test_a_group_is_created_once_and_busygroup_is_not_an_error(clients: tuple[Any, Any]) -> None:
    sync, aio = clients
    assert run(sync, create_group("s")) is True
    assert run(sync, create_group("s")) is False
    assert asyncio.run(run_async(aio, create_group("s"))) is False
    assert [g["name"] for g in sync.xinfo_groups("s")] == [keys.JOBS_GROUP.encode()]


def test_another_error_creating_a_group_is_raised(clients: tuple[Any, Any]) -> None:
    sync, _aio = clients
    sync.set("not-a-stream", b"x")
    with pytest.raises(Exception, match="WRONGTYPE"):
        run(sync, create_group("not-a-stream"))


def test_queue_states_count_shared_and_placed_streams_per_worker(clients: tuple[Any, Any]) -> None:
    sync, _aio = clients
    assert both(clients, queue_states, ["m"]) == {"m": QueueState(0, 0, {}, {})}
    sync.xadd(keys.jobs_stream("m", "high"), {"job": b"x"})  # no group yet: every entry waits
    sync.sadd(keys.placed_workers("m"), "w1")
    placed = keys.worker_jobs_stream("m", "w1")
    run(sync, create_group(placed))
    for job in (b"y", b"z", b"t"):
        sync.xadd(placed, {"job": job})
    [[_stream, [(done, _fields), _held]]] = sync.xreadgroup(keys.JOBS_GROUP, "w1", {placed: ">"}, count=2)
    pipe = sync.pipeline()
    queue_job_done(pipe, placed, done)  # acked and deleted: no longer counted anywhere
    pipe.execute()
    states = both(clients, queue_states, ["m", "other"])
    assert states["m"] == QueueState(waiting=2, in_flight=1, placed={"w1": 1}, held={"w1": 1})
    assert states["other"] == QueueState(0, 0, {}, {})


def test_queue_states_create_a_missing_shared_group_only_when_asked(clients: tuple[Any, Any]) -> None:
    sync, _aio = clients
    run(sync, queue_states(["m"]))
    assert not sync.exists(keys.jobs_stream("m"))
    run(sync, queue_states(["m"], create_missing_groups=True))
    assert all(sync.xinfo_groups(s) for s in keys.jobs_streams("m"))


def test_streams_with_waiting_are_those_holding_a_job_not_yet_taken(clients: tuple[Any, Any]) -> None:
    sync, _ = clients
    taken, untaken, empty, ungrouped = "s:taken", "s:untaken", "s:empty", "s:ungrouped"
    for stream in (taken, untaken, empty):
        run(sync, create_group(stream))
    sync.xadd(taken, {"job": b"1"})
    sync.xreadgroup(keys.JOBS_GROUP, "w1", {taken: ">"})  # taken, not acked: not waiting
    sync.xadd(untaken, {"job": b"2"})
    done = sync.xadd(empty, {"job": b"3"})
    sync.xreadgroup(keys.JOBS_GROUP, "w1", {empty: ">"})
    pipe = sync.pipeline()
    queue_job_done(pipe, empty, done)  # acked jobs are deleted: nothing left
    pipe.execute()
    sync.xadd(ungrouped, {"job": b"4"})  # no group: the read that follows meets NOGROUP, as before
    missing = "s:missing"  # no stream at all: the same
    assert both(clients, streams_with_waiting, [taken, untaken, empty, ungrouped, missing]) == {
        untaken, ungrouped, missing}


def test_fresh_workers_are_those_within_the_ttl_draining_ones_included(clients: tuple[Any, Any]) -> None:
    sync, _aio = clients
    now = 1000.0
    for worker_id, heartbeat, state in (("fresh", now - 1, "ready"), ("draining", now - 1, "draining"),
                                        ("stale", now - 30, "ready"), ("ancient", now - 500, "ready")):
        entry = RegistryEntry(worker_id=worker_id, model="m", slots=2, heartbeat=heartbeat, started=0, state=state)
        sync.hset(keys.worker_key(worker_id), mapping=entry.to_hash())
        sync.zadd(keys.WORKERS_INDEX, {worker_id: heartbeat})
    sync.zadd(keys.WORKERS_INDEX, {"malformed": now})
    sync.hset(keys.worker_key("malformed"), mapping={"model": "m"})
    found = both(clients, fresh_workers, now, 10.0)
    assert sorted(w.worker_id for w in found) == ["draining", "fresh"]
    assert [w.worker_id for w in found if w.is_live(now, 10.0)] == ["fresh"]
    assert sync.zscore(keys.WORKERS_INDEX, "ancient") is None  # silent for ten TTLs: forgotten


def test_an_event_is_journalled_before_it_is_published(clients: tuple[Any, Any]) -> None:
    sync, _aio = clients
    pipe = sync.pipeline()
    queue_event(pipe, "m", "req-1", 3, b"event", journal_ttl_s=60, refresh_ttl=True)
    assert [c[0][0] for c in pipe.command_stack] == ["XADD", "EXPIRE", "PUBLISH"]
    pipe.execute()
    [(_id, fields)] = sync.xrange(keys.journal_stream("m", "req-1"))
    assert fields == {keys.JOURNAL_SEQ_FIELD.encode(): b"3", keys.JOURNAL_EVENT_FIELD.encode(): b"event"}
    assert 0 < sync.ttl(keys.journal_stream("m", "req-1")) <= 60


@pytest.mark.parametrize(("error", "kind", "said"), [
    (OutOfMemoryError("Command # 1 (HSET h a 1) of pipeline caused error: command not allowed when used memory > "
                      "'maxmemory'."), "OOM", "Redis is full (OOM command not allowed when used memory > 'maxmemory')"),
    (ResponseError("Error running script (call to f_b73c): @user_script:1: @user_script: 1: -OOM command not allowed "
                   "when used memory > 'maxmemory'."), "OOM", "Redis is full (OOM command not allowed"),
    (ReadOnlyError("You can't write against a read only replica."), "READONLY",
     "Redis is read-only (a replica, or a primary demoted since) (READONLY You can't write against a read only"),
    (ResponseError("MISCONF Redis is configured to save RDB snapshots, but it is currently not able to persist on "
                   "disk."), "MISCONF", "Redis refuses writes (its last save to disk failed) (MISCONF Redis is"),
    (ResponseError("Error running script (call to f_b73c): @user_script:1: @user_script: 1: -MISCONF Redis is "
                   "configured to save RDB snapshots"), "MISCONF", "(MISCONF Redis is configured to save RDB"),
    (RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), None, None),
    (RedisTimeoutError("Timeout reading from socket"), None, None),
    (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), None, None),
], ids=["oom", "oom-in-script", "readonly", "misconf", "misconf-in-script", "unreachable", "timeout", "wrongtype"])
def test_a_refused_write_is_told_from_unreachability(error: Exception, kind: str | None, said: str | None) -> None:
    """Redis's replies as redis-py raises them (plain, in a pipeline, from a script), as a real redis-server 6.2 sent them."""
    assert write_refusal(error) == kind
    described = describe_refusal(error)
    assert (described is None) if said is None else (described is not None and said in described)
