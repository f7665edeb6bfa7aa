"""On a real 3-primary Redis Cluster: the scripts and transactions over one model's keys run (one slot each, by the
model's hash tag), while the cluster refuses the same script over two models' keys (CROSSSLOT), so the bed checks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from shared import keys
from shared.fair_queue import FAIR_SCRIPT, GATEWAY_READY, FairJob
from shared.redis_commands import create_group, run
from tests.support.cluster_bed import ClusterBed
from worker.failover.stealing import FORGET_SCRIPT

MODELS = ("smollm2-135m", "qwen3:0.6b", "org/model.Q4_K_M")


@pytest.fixture(scope="module")
def cluster() -> Iterator[redis.RedisCluster]:
    try:
        bed = ClusterBed().start()
    except RuntimeError as exc:  # no redis-server binary
        pytest.skip(f"no Redis Cluster bed: {exc}")
    client = bed.client()
    try:
        yield client
    finally:
        client.close()
        bed.stop()


def _job(model: str, request_id: str) -> bytes:
    """Stand-in job bytes (the scripts move them without decoding)."""
    return f"{model}/{request_id}".encode()


def test_the_models_spread_over_the_primaries(cluster: redis.RedisCluster) -> None:
    nodes = {cluster.get_node_from_key(keys.jobs_stream(model)).name for model in MODELS}
    assert len(nodes) >= 2  # different models land on different primaries (these three do)


@pytest.mark.parametrize("model", MODELS)
def test_a_fair_queue_enqueue_releases_into_the_shared_stream(cluster: redis.RedisCluster, model: str) -> None:
    for stream in keys.jobs_streams(model):
        run(cluster, create_group(stream))
    job = FairJob("req-1", _job(model, "req-1"), "tenant-a", 4.0, 1.0, 60)
    moved = cluster.eval(FAIR_SCRIPT, 4, *keys.fair_keys(model), "enqueue", GATEWAY_READY, 100, keys.JOBS_GROUP,
                         job.request_id, job.data, job.tenant, job.cost, job.weight, job.ttl_s)  # as queue_fair sends it
    assert moved == 1  # released at once: the stream had nothing waiting
    assert cluster.xlen(keys.jobs_stream(model)) == 1


@pytest.mark.parametrize("model", MODELS)
def test_placement_and_forgetting_a_worker_stay_in_one_slot(cluster: redis.RedisCluster, model: str) -> None:
    worker_id = "w-1"
    stream = keys.worker_jobs_stream(model, worker_id)
    pipe = cluster.pipeline(transaction=True)  # the gateway's placed XADD + SADD
    pipe.xadd(stream, {keys.JOB_FIELD: _job(model, "req-2")})
    pipe.sadd(keys.placed_workers(model), worker_id)
    pipe.execute()
    assert cluster.sismember(keys.placed_workers(model), worker_id)
    forget = [1 + len(keys.PRIORITY_ORDER), keys.placed_workers(model), *keys.worker_jobs_streams(model, worker_id),
              keys.JOBS_GROUP, worker_id]
    assert not cluster.eval(FORGET_SCRIPT, *forget)  # a job still waits in it: kept
    cluster.delete(stream)
    assert cluster.eval(FORGET_SCRIPT, *forget)
    assert not cluster.sismember(keys.placed_workers(model), worker_id)


def test_the_cluster_refuses_one_script_over_two_models(cluster: redis.RedisCluster) -> None:
    """Sent straight to the node of the first key (the cluster client would refuse it before sending)."""
    a, b = keys.fair_keys(MODELS[0]), keys.fair_keys(MODELS[1])
    owner = cluster.get_node_from_key(a[0])
    with redis.Redis(host=owner.host, port=owner.port) as node, pytest.raises(redis.ResponseError, match="same slot"):
        node.eval(FAIR_SCRIPT, 4, a[0], a[1], b[2], b[3], "release", 1, 100, keys.JOBS_GROUP)
