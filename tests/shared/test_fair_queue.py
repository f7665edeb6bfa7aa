"""The fair queue of a priority class (shared/redis_commands.py FAIR_SCRIPT) on a real Redis: jobs released in
start-time fair order across tenants, weighted by token work, only while the shared stream has room."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shared import keys
from shared.redis_commands import FairJob, queue_fair, queue_states, release_fair, run

pytestmark = pytest.mark.integration
MODEL = "m"


@pytest.fixture()
def client(redis_server: Any) -> redis.Redis:
    """A client of the test's real Redis, with the normal class's stream and group created."""
    client = redis.Redis.from_url(redis_server.url)
    client.xgroup_create(keys.jobs_stream(MODEL), keys.JOBS_GROUP, id="0", mkstream=True)
    return client


def enqueue(client: redis.Redis, request_id: str, tenant: str, *, cost: float = 100, weight: float = 1,
            priority: str = "normal") -> int:
    """Queue one job as a gateway does; how many jobs the call released into the stream."""
    pipe = client.pipeline(transaction=True)
    queue_fair(pipe, MODEL, priority, FairJob(request_id, request_id.encode(), tenant, cost, weight, 60), maxlen=1000)
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
    assert not client.exists(*keys.fair_keys(MODEL)[:3])  # an empty fair queue leaves no state behind


def test_one_tenants_burst_does_not_delay_anothers_single_request(client: redis.Redis) -> None:
    for i in range(50):
        enqueue(client, f"a{i}", "A")
    enqueue(client, "b0", "B")
    order = [job for _ in range(51) for job in take(client, 1)]
    assert order.index("b0") <= 2  # behind the one already in the stream and at most one more of A's
    assert [job for job in order if job != "b0"] == [f"a{i}" for i in range(50)]  # a tenant's own stay in order


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
