"""The fair queue of a priority class (shared/fair_queue.py FAIR_SCRIPT) on a real Redis: jobs released in
start-time fair order across tenants, weighted by token work, only while the shared stream has room; a newcomer to
a saturated class sent to the class above's stream."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shared import keys
from shared.fair_queue import (
    FAIR_SCRIPT,
    GATEWAY_READY,
    FairJob,
    in_lane,
    queue_fair,
    queue_taken,
    release_fair,
)
from shared.redis_commands import queue_states, run

pytestmark = pytest.mark.integration
MODEL = "m"


@pytest.fixture()
def client(redis_server: Any) -> redis.Redis:
    """A client of the test's real Redis, with the normal class's stream and group created."""
    client = redis.Redis.from_url(redis_server.url)
    client.xgroup_create(keys.jobs_stream(MODEL), keys.JOBS_GROUP, id="0", mkstream=True)
    return client


def enqueue(client: redis.Redis, request_id: str, tenant: str, *, cost: float = 100, weight: float = 1,
            priority: str = "normal", full: bool = False) -> int:
    """Queue one job as a gateway does; how many jobs the call released into the stream."""
    pipe = client.pipeline(transaction=True)
    queue_fair(pipe, MODEL, priority, FairJob(request_id, request_id.encode(), tenant, cost, weight, 60), maxlen=1000,
               full=full)
    return pipe.execute()[0]


def take(client: redis.Redis, count: int) -> list[str]:
    """Release up to `count` jobs as a worker with that much room does, and read them (their payload is the id)."""
    run(client, release_fair(MODEL, {"normal": count}, maxlen=1000))
    replies = client.xreadgroup(keys.JOBS_GROUP, "w", {keys.jobs_stream(MODEL): ">"}, count=count) or []
    return [fields[keys.JOB_FIELD.encode()].decode() for _stream, messages in replies for _mid, fields in messages]


def test_a_job_goes_straight_to_the_stream_when_nothing_waits(client: redis.Redis) -> None:
    assert enqueue(client, "a0", "A") == 1  # an idle worker is woken at once
    assert enqueue(client, "a1", "A") == 0  # one waits in the stream already: the next waits its turn
    assert run(client, queue_states([MODEL]))[MODEL].waiting == 2  # both count against the queue limit
    assert take(client, 4) == ["a0", "a1"]
    assert client.xlen(keys.jobs_stream(MODEL)) == 2 and all(  # released or written at once: with its tenant
        fields[keys.TENANT_FIELD.encode()] == b"A" for _mid, fields in client.xrange(keys.jobs_stream(MODEL)))
    assert not client.exists(*keys.fair_keys(MODEL)[:3])  # an empty fair queue leaves no state behind


def lane(client: redis.Redis, priority: str = "normal") -> list[str]:
    """The ids of the jobs a class's newcomers were sent to the class above's stream with."""
    stream = keys.fair_lane_keys(MODEL, priority)[1]
    return [fields[keys.JOB_FIELD.encode()].decode() for _mid, fields in client.xrange(stream)]


def test_one_tenants_burst_does_not_delay_anothers_single_request(client: redis.Redis) -> None:
    for i in range(50):
        enqueue(client, f"a{i}", "A")
    enqueue(client, "b0", "B")  # B has nothing waiting and the class is saturated: the class above's stream
    assert lane(client) == ["b0"] and in_lane(keys.fair_lane_keys(MODEL)[1], MODEL, "normal")
    (_mid, fields), = client.xrange(keys.fair_lane_keys(MODEL)[1])
    assert fields[keys.TENANT_FIELD.encode()] == b"B"  # beside the job's bytes: the worker counts it taken by it
    enqueue(client, "b1", "B")  # b0 is not taken yet: b1 is no newcomer, it queues (first in tag order)
    order = [job for _ in range(51) for job in take(client, 1)]
    assert order.index("b1") <= 3  # behind the one in the stream and two of A's: b0 was counted against B's share
    assert [job for job in order if job != "b1"] == [f"a{i}" for i in range(50)]  # a tenant's own stay in order


def test_a_tenant_is_a_newcomer_again_once_its_jobs_are_taken(client: redis.Redis) -> None:
    for i in range(5):
        enqueue(client, f"a{i}", "A")
    enqueue(client, "b0", "B")
    enqueue(client, "b1", "B")
    assert lane(client) == ["b0"]
    pipe = client.pipeline()
    queue_taken(pipe, MODEL, [("normal", "B")])  # a worker took b0
    pipe.execute()
    enqueue(client, "b2", "B")  # b1 still waits in the queue: no newcomer
    assert take(client, 8).index("b1") <= 3
    pipe = client.pipeline()
    queue_taken(pipe, MODEL, [("normal", "B"), ("normal", "B")])  # b1 and b2 taken
    pipe.execute()
    for i in range(5, 8):
        enqueue(client, f"a{i}", "A")
    enqueue(client, "b3", "B")
    assert lane(client) == ["b0", "b3"]


def test_no_newcomer_skips_an_unsaturated_class_or_the_top_one(client: redis.Redis) -> None:
    enqueue(client, "a0", "A")  # nothing waits: straight into its own stream
    assert take(client, 1) == ["a0"] and lane(client) == []
    for i in range(3):
        enqueue(client, f"c{i}", "A", priority="critical")
    enqueue(client, "d0", "D", priority="critical")  # no class above critical: it queues
    assert client.zscore(keys.fair_keys(MODEL, "critical")[0], "d0") is not None


def test_a_newcomer_skips_when_every_worker_is_full_though_nothing_is_queued(client: redis.Redis) -> None:
    """The tail of a burst: every slot held, nothing queued or waiting; the gateway saw the workers full."""
    enqueue(client, "b0", "B", full=True)
    assert lane(client) == ["b0"] and client.xlen(keys.jobs_stream(MODEL)) == 0


def test_an_enqueue_without_the_lane_keys_queues_as_before(client: redis.Redis) -> None:
    """A gateway that predates the lane sends four keys: its newcomers queue (a rolling upgrade keeps working)."""
    for i in range(3):
        enqueue(client, f"a{i}", "A")
    client.eval(FAIR_SCRIPT, 4, *keys.fair_keys(MODEL), "enqueue", GATEWAY_READY, 1000, keys.JOBS_GROUP, "b0", b"b0",
                "B", 100, 1, 60)
    assert lane(client) == [] and client.zscore(keys.fair_keys(MODEL)[0], "b0") is not None


def test_tenants_alternate_weighted_by_token_work(client: redis.Redis) -> None:
    for i in range(12):
        enqueue(client, f"a{i}", "A", cost=100)
        enqueue(client, f"b{i}", "B", cost=200)  # twice the work a job
        enqueue(client, f"c{i}", "C", cost=100, weight=2)  # twice the share
    first = [job for _ in range(20) for job in take(client, 1)][1:]  # the first went straight to the stream
    shares = {tenant: sum(job.startswith(tenant) for job in first) for tenant in "abc"}
    assert shares["c"] >= 1.5 * shares["a"] >= 3 * shares["b"] * 0.9, shares  # 4 : 2 : 1 of tokens served


def test_an_idle_tenant_banks_no_credit(client: redis.Redis) -> None:
    enqueue(client, "b0", "B")  # served alone, long ago
    assert take(client, 1) == ["b0"]
    for i in range(10):
        enqueue(client, f"a{i}", "A")
    for i in range(1, 4):
        enqueue(client, f"b{i}", "B")
    order = [job for _ in range(13) for job in take(client, 1)]
    assert order[:7] == ["a0", "a1", "b1", "a2", "b2", "a3", "b3"]  # alternate from now on, no catching up


def test_a_worker_releases_as_many_as_it_has_room_for(client: redis.Redis) -> None:
    for i in range(10):
        enqueue(client, f"a{i}", "A")
    assert len(take(client, 6)) == 6
    assert run(client, queue_states([MODEL]))[MODEL].waiting == 4


def test_classes_have_queues_of_their_own(client: redis.Redis) -> None:
    enqueue(client, "h0", "A", priority="high")
    enqueue(client, "h1", "A", priority="high")
    assert client.zcard(keys.fair_keys(MODEL, "high")[0]) == 1 and client.xlen(keys.jobs_stream(MODEL, "high")) == 1
    assert run(client, release_fair(MODEL, {"high": 2, "normal": 0}, maxlen=1000)) == 1


def test_a_redis_without_the_script_gets_it_back(client: redis.Redis) -> None:
    for i in range(3):
        enqueue(client, f"a{i}", "A")
    client.script_flush()  # as after a restart that kept the data (AOF)
    assert run(client, release_fair(MODEL, {"normal": 3}, maxlen=1000)) == 0  # NOSCRIPT: loaded for the next look
    assert run(client, release_fair(MODEL, {"normal": 3}, maxlen=1000)) == 2
