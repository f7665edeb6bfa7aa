"""The node agent's Redis side on a real redis-server: queue depth over shared and placed streams, the load
claim (one winner, renewed or dropped only by its holder), and a failed load ending its waiting jobs."""

from __future__ import annotations

import time

import pytest
import redis

from llmfleet import warm_pool_redis
from shared import codec, keys
from shared.messages import ErrorEvent, GenerateJob, Sampling


@pytest.fixture()
def client(redis_server) -> redis.Redis:
    """A bytes client of the test's redis-server."""
    return redis.Redis.from_url(redis_server.url)


def test_queue_depth_counts_shared_and_placed_streams(client: redis.Redis) -> None:
    assert warm_pool_redis.queue_depths(client, ["m"]) == {"m": warm_pool_redis.QueueDepth(0, 0)}
    client.xadd(keys.jobs_stream("m", "high"), {"job": b"x"})
    client.sadd(keys.placed_workers("m"), "w1")
    placed = keys.worker_jobs_stream("m", "w1")
    client.xgroup_create(placed, keys.JOBS_GROUP, id="0", mkstream=True)
    client.xadd(placed, {"job": b"y"})
    client.xadd(placed, {"job": b"z"})
    client.xreadgroup(keys.JOBS_GROUP, "w1", {placed: ">"}, count=1)
    depth = warm_pool_redis.queue_depths(client, ["m", "other"])
    assert depth["m"] == warm_pool_redis.QueueDepth(waiting=2, pending=1, held=(("w1", 1),)) and depth["m"].busy
    # the job w1 holds is demand once w1 has no registry entry (it stopped or died as it read it)
    assert depth["m"].orphaned({"w1"}) == 0 and depth["m"].orphaned({"w2"}) == 1
    assert not depth["other"].busy


def test_one_node_wins_the_claim_and_only_it_renews_or_drops_it(client: redis.Redis) -> None:
    assert warm_pool_redis.claim_load(client, "m", "a", 10)
    assert not warm_pool_redis.claim_load(client, "m", "b", 10)
    warm_pool_redis.release_load(client, "m", "b")  # not b's: left alone
    assert client.get(keys.pool_loading("m")) == b"a"
    warm_pool_redis.release_load(client, "m", "a", keep_s=0.2)  # renewed for 0.2 s from now
    assert 0 < client.pttl(keys.pool_loading("m")) <= 200
    time.sleep(0.3)
    assert warm_pool_redis.claim_load(client, "m", "b", 10)  # lapsed: b wins now
    warm_pool_redis.release_load(client, "m", "b")
    assert client.get(keys.pool_loading("m")) is None


def test_a_failed_load_ends_every_waiting_job_with_its_error(client: redis.Redis) -> None:
    now = time.time()
    ids = [f"req-{i}" for i in range(3)]
    for request_id in ids:
        job = GenerateJob(id=request_id, model="m", created=now, deadline=now + 60, prompt="hi", sampling=Sampling())
        client.xadd(keys.jobs_stream("m"), {keys.JOB_FIELD: codec.encode_job(job)})
    client.xadd(keys.jobs_stream("m"), {keys.JOB_FIELD: b"not msgpack"})
    warm_pool_redis.record_failure(client, "m", "model 'm' could not be loaded: bad file", 30)
    assert warm_pool_redis.fail_waiting(client, "m", "n1", "model 'm' could not be loaded: bad file", retry_after=30,
                                   journal_ttl_s=60) == 3
    for request_id in ids:
        [(_, fields)] = client.xrange(keys.journal_stream("m", request_id))
        event = codec.decode_event(fields[b"event"])
        assert isinstance(event, ErrorEvent) and event.seq == 0 and event.status == 503
        assert event.code == "model_load_failed" and "bad file" in event.message
    assert client.xlen(keys.jobs_stream("m")) == 0  # acked and deleted, the unreadable one too
    assert warm_pool_redis.remembered_failure(client, "m") == "model 'm' could not be loaded: bad file"
    assert warm_pool_redis.fail_waiting(client, "m", "n1", "x", retry_after=1, journal_ttl_s=60) == 0
