"""kill -9 of the Redis Cluster primary that holds a model's slot, under streams in flight (REDIS_CLUSTER=1: a
gateway and two SmolLM2 workers on three primaries with a replica each): the cluster promotes the replica, the
gateway's channels and the workers' clients follow it, and every stream ends exactly once, with the text an
undisturbed run gives; a new request is served soon after."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmfleet.local_cluster import LocalCluster
from shared import keys
from tests.support.cluster import MODEL, start_process_cluster
from tests.support.cluster_bed import ClusterBed, sharded_bed
from tests.support.openai_streams import stream_completion

pytestmark = [pytest.mark.slow, pytest.mark.integration]
STREAMS = 4


@pytest.fixture
def fleet(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[tuple[ClusterBed, LocalCluster]]:
    with sharded_bed(replicas=1) as bed:
        cluster = start_process_cluster(tmp_path, 2, redis_url=f"redis://127.0.0.1:{bed.ports[0]}",
                                        REDIS_CLUSTER="1", LLMFLEET_HOST="127.0.0.1", LLMFLEET_LOG_LEVEL="WARNING",
                                        LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_LEASE_S="30")
        try:
            yield bed, cluster
        finally:
            cluster.close()


def _stream(base: str, index: int, result: dict[str, Any]) -> None:
    stream_completion(base, result, f"Story {index}: a lighthouse keeper", 60)


def _run(base: str, started: threading.Event | None = None) -> list[dict[str, Any]]:
    """STREAMS streams at once; `started` is set once each has sent three pieces."""
    results: list[dict[str, Any]] = [{} for _ in range(STREAMS)]
    threads = [threading.Thread(target=_stream, args=(base, i, results[i])) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    if started is not None:
        deadline = time.monotonic() + 120
        while not all(len(r.get("times", [])) >= 3 or "error" in r for r in results):
            assert time.monotonic() < deadline, "the streams did not start"
            time.sleep(0.05)
        started.set()
    for thread in threads:
        thread.join(timeout=180)
        assert not thread.is_alive(), "a stream hung"
    return results


def test_kill_9_of_the_models_primary_loses_no_stream(fleet: tuple[ClusterBed, LocalCluster]) -> None:
    bed, cluster = fleet
    undisturbed = _run(cluster.base_url)
    assert all("text" in r for r in undisturbed), undisturbed
    started, disturbed = threading.Event(), []
    runner = threading.Thread(target=lambda: disturbed.extend(_run(cluster.base_url, started)))
    runner.start()
    assert started.wait(120)
    owner = cluster.client.get_node_from_key(keys.jobs_stream(MODEL)).port
    bed.kill_primary(bed.ports.index(owner))
    killed_at = time.monotonic()
    runner.join(timeout=200)
    assert not runner.is_alive()
    assert [r.get("text", r.get("error")) for r in disturbed] == [r["text"] for r in undisturbed]
    gaps = [b - a for r in disturbed for a, b in zip(r["times"], r["times"][1:]) if b > killed_at]
    print(f"longest silence after the kill: {max(gaps, default=0):.2f}s")
    assert max(gaps, default=0) < 10, f"a stream was silent for {max(gaps):.1f}s"
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)
    reply = client.completions.create(model=MODEL, prompt="After the failover:", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4 and time.monotonic() - killed_at < 60
