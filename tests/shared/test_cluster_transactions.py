"""Every MULTI/EXEC and script llmfleet runs stays in one Redis Cluster slot: the key builders' slots checked with
redis-py's key_slot, and the worker's turn (TAKE, PUBLISH and RENEW scripts in one MULTI), the fair queue's release
after a NOSCRIPT, the gateway's stream-ownership WATCH/MULTI and a worker's heartbeat run on a 3-primary cluster."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from redis.cluster import key_slot

from gateway.cluster.streams import NOBODY, StreamRecord, Streams
from shared import codec, keys
from shared.fair_queue import FAIR_SCRIPT, release_fair
from shared.messages import DoneEvent, TokenEvent, Usage
from shared.placing import place_args
from shared.redis_commands import create_group, run
from shared.settings import Settings
from tests.support.cluster_bed import ClusterBed
from worker.failover.fencing import Lease, renew_leases, take_ownership
from worker.serve.heartbeat import Heartbeat
from worker.serve.publish_sender import BatchSender, RequestWrite, StepBatch

MODELS = ("smollm2-135m", "qwen3:0.6b", "org/model.Q4_K_M")


def _one_slot(names: list[str]) -> bool:
    return len({key_slot(name.encode()) for name in names}) == 1


@pytest.mark.parametrize("model", MODELS)
def test_each_transaction_builders_keys_share_one_slot(model: str) -> None:
    rid = "req-1"
    fenced = [keys.owner_key(model, rid), keys.journal_stream(model, rid), keys.events_channel(model, rid),
              keys.jobs_stream(model, "high"), keys.worker_jobs_stream(model, "w1", "low")]
    assert _one_slot(fenced)  # PUBLISH_SCRIPT's keys; TAKE and RENEW use a subset
    assert _one_slot([*fenced, keys.cancelled_marker(model, "req-2"), keys.owner_key(model, "req-3"),
                      keys.cancel_channel(model), *keys.fair_keys(model, "critical")])  # a worker's turn, its MGET
    script_keys, _argv = place_args(model, "normal", [], [], [keys.prefix_owner(model, "abc")], b"job",
                                    others=("w9",), maxlen=100, prefix_ttl_ms=1000, balance_abs=2, balance_rel=0.5,
                                    check_balance=True, fallback="new")
    assert _one_slot(script_keys)
    assert _one_slot([keys.loras_desired(model), keys.loras_version(model), keys.loras_errors(model)])
    assert _one_slot([keys.stream_record("chatcmpl-1"), keys.gateway_streams("g1"), keys.ORPHANS])


@pytest.fixture(scope="module")
def bed() -> Iterator[ClusterBed]:
    try:
        started = ClusterBed().start()
    except RuntimeError as exc:  # no redis-server binary
        pytest.skip(f"no Redis Cluster bed: {exc}")
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def cluster(bed: ClusterBed) -> Iterator[redis.RedisCluster]:
    client = bed.client()
    try:
        yield client
    finally:
        client.close()


@pytest.mark.parametrize("model", MODELS)
def test_a_worker_turn_takes_publishes_renews_and_acks_on_the_cluster(bed: ClusterBed, cluster: redis.RedisCluster,
                                                                      model: str) -> None:
    if not bed.sharded:  # the publish script SPUBLISHes on a cluster
        pytest.skip(f"the bed's redis-server {bed.version} has no sharded pub/sub (7.0 or later needed)")
    cluster.script_flush()  # every primary: the scripts come back through NOSCRIPT
    stream, rid = keys.jobs_stream(model), f"req-{uuid.uuid4().hex[:8]}"
    run(cluster, create_group(stream))
    entry = cluster.xadd(stream, {keys.JOB_FIELD: b"job"}).decode()
    cluster.xreadgroup(keys.JOBS_GROUP, "w1", {stream: ">"})
    [grant] = take_ownership(cluster, stream, "w1", model, [(rid, entry)], ttl_s=60)
    assert grant.owner == "1:w1"
    assert renew_leases(cluster, stream, "w1", model, [Lease(entry, rid, grant.owner, stream)]) == []
    sender = BatchSender(cluster, 60, model=model)
    events = [TokenEvent(id=rid, seq=0, text="a", token_ids=[5]),
              DoneEvent(id=rid, seq=1, usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2))]
    sender.submit(StepBatch(writes=[RequestWrite(rid, grant.owner, events, ack=(stream, entry))]))
    sender.send_now()
    journal = cluster.xrange(keys.journal_stream(model, rid))
    assert [codec.decode_event(f[keys.JOURNAL_EVENT_FIELD.encode()]).seq for _, f in journal] == [0, 1]
    assert cluster.get(keys.owner_key(model, rid)) == b"done"
    assert cluster.xlen(stream) == 0  # acked and deleted


def test_a_fair_release_loads_its_script_where_it_was_missing(cluster: redis.RedisCluster) -> None:
    model = MODELS[1]
    for stream in keys.jobs_streams(model):
        run(cluster, create_group(stream))
    cluster.eval(FAIR_SCRIPT, 4, *keys.fair_keys(model), "enqueue", 0, 100, keys.JOBS_GROUP, "r1", b"job", "t", 1.0,
                 1.0, 60)  # queued, not released (ready 0)
    cluster.script_flush()
    assert run(cluster, release_fair(model, {"normal": 1}, maxlen=100)) == 0  # NOSCRIPT: loaded for the next look
    assert run(cluster, release_fair(model, {"normal": 1}, maxlen=100)) == 1


def test_a_heartbeat_registers_across_slots(cluster: redis.RedisCluster) -> None:
    model = MODELS[2]
    beat = Heartbeat(cluster, worker_id="w-beat", model=model, slots=2, interval_s=1.0, ttl_s=5.0,
                     gauges=lambda: {"load": 0, "served": 0}, held_jobs=list, drop_tier=lambda: None)
    beat.beat()
    assert cluster.hget(keys.worker_key("w-beat"), "model") == model.encode()
    assert cluster.zscore(keys.MODELS_INDEX, model) is not None
    beat.deregister()
    assert not cluster.exists(keys.worker_key("w-beat"))


def test_stream_ownership_changes_run_on_the_cluster(bed: ClusterBed) -> None:
    async def main() -> None:
        client = redis.asyncio.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in bed.startup_nodes])
        try:
            await client.initialize()  # redis-py 8.1: a MULTI as an async cluster client's first command fails
            await _detach_and_reap(client)
        finally:
            await client.aclose()

    asyncio.run(main())


async def _detach_and_reap(async_cluster: redis.asyncio.RedisCluster) -> None:
    """A stream opened, left by its client (WATCH/MULTI: owner, orphans, gateway's set), reaped after the grace."""
    cancels: list[str] = []

    async def cancel(request_id: str, model: str, reason: str, deadline: float) -> None:
        cancels.append(request_id)

    now = [1000.0]
    streams = Streams(async_cluster, Settings(orphan_grace_s=5.0), cancel, clock=lambda: now[0])
    sid = f"chatcmpl-{uuid.uuid4().hex[:8]}"
    await streams.open(StreamRecord(stream_id=sid, api="chat", body={"model": "m"}, request_id="req-" + sid,
                                    job_ids=["req-" + sid], model="m", created=1000.0, deadline=1600.0, key=None))
    assert await streams.detach(sid)
    assert await async_cluster.hget(keys.stream_record(sid), "owner") == NOBODY.encode()
    now[0] += 6.0
    await streams._sweep()
    assert cancels == ["req-" + sid]


def test_the_cluster_setting_refuses_sentinels_and_unix_sockets_and_old_nodes() -> None:
    from batches.redis_clients import cluster_version_problem

    assert Settings.from_env({"REDIS_CLUSTER": "1"}).redis_target.cluster
    for env in ({"REDIS_SENTINELS": "h:26379"}, {"REDIS_URL": "unix:///tmp/redis.sock"}):
        with pytest.raises(ValueError, match="REDIS_CLUSTER|REDIS_URL"):
            Settings.from_env({"REDIS_CLUSTER": "1", **env})
    assert cluster_version_problem({"a:1": "7.0.15", "b:2": "7.2.4"}) is None
    assert "b:2 (6.2.6)" in (cluster_version_problem({"a:1": "7.0.15", "b:2": "6.2.6"}) or "")


def test_cancels_and_events_travel_by_sharded_pub_sub(bed: ClusterBed, cluster: redis.RedisCluster) -> None:
    """A gateway's SPUBLISHed cancel reaches a worker's CancelListener; a worker's event reaches the gateway's
    per-node subscriber (gateway/cluster/sharded_subscriber.py)."""
    import time

    from gateway.cluster.sharded_subscriber import ClusterSubscriber, node_clients
    from shared.messages import CancelRequest
    from shared.redis_commands import publish
    from worker.serve.cancel_listener import CancelListener

    if not bed.sharded:
        pytest.skip(f"the bed's redis-server {bed.version} has no sharded pub/sub (7.0 or later needed)")
    model = MODELS[0]
    listener = CancelListener(cluster, model)
    listener.start()
    try:
        publish(cluster, keys.cancel_channel(model), codec.encode(CancelRequest(id="r-9", model=model, reason="x")))
        deadline = time.monotonic() + 5
        while not (seen := listener.drain()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == ["r-9"]
    finally:
        listener.stop()

    async def events() -> bytes:
        client = redis.asyncio.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in bed.startup_nodes])
        host, port = bed.startup_nodes[0]
        subscriber = ClusterSubscriber(client, node_clients(f"redis://{host}:{port}/0"))
        try:
            await subscriber.start()
            queue = await subscriber.subscribe(keys.events_channel(model, "r-9"))
            await client.spublish(keys.events_channel(model, "r-9"), b"event")
            async with asyncio.timeout(5):
                return await queue.get()  # type: ignore[return-value]
        finally:
            await subscriber.close()
            await client.aclose()

    assert asyncio.run(events()) == b"event"


def test_the_batches_api_answers_501_on_a_cluster() -> None:
    import fakeredis
    import httpx

    from gateway.app import create_app

    app = create_app(Settings(redis_cluster=1), redis=fakeredis.FakeAsyncRedis())

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/v1/batches")

    response = asyncio.run(get())
    assert response.status_code == 501 and response.json()["error"]["code"] == "batches_unavailable"
