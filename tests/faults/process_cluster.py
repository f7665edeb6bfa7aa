"""Helpers of the fault tests: who holds which job, a stream through a kill -9; the cluster itself is
llmfleet/local_cluster.py's LocalCluster (ProcessCluster here), waiting is tests/support's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from llmfleet.local_cluster import LocalCluster as ProcessCluster
from shared import keys
from tests.support.processes import http_json, wait_until

__all__ = ["MODEL", "ProcessCluster", "heartbeat_loads", "job_holders", "model_streams", "ready",
           "stream_through_a_kill", "wait_until"]

MODEL = "smollm2-135m"


def heartbeat_loads(client: Any) -> dict[str, int]:
    """Each registered worker's load as its last heartbeat published it (every LLMFLEET_HEARTBEAT_INTERVAL_S)."""
    ids = [w.decode() for w in client.zrange(keys.WORKERS_INDEX, 0, -1)]
    return {w: int(client.hget(keys.worker_key(w), "load") or 0) for w in ids}


def model_streams(client: Any, model: str = MODEL) -> list[str]:
    """Every job stream of the model: the shared ones and those of each worker that got placed jobs."""
    placed = sorted(w.decode() for w in client.smembers(keys.placed_workers(model)))
    return [*keys.jobs_streams(model), *(s for w in placed for s in keys.worker_jobs_streams(model, w))]


def job_holders(client: Any, model: str = MODEL) -> list[str]:
    """The workers holding jobs of the model (pending entries), over all its streams: with two or more workers
    a job is usually placed on a worker's own stream (gateway/cluster/placement.py), not the shared one."""
    holders: list[str] = []
    for stream in model_streams(client, model):
        if client.exists(stream):
            for consumer in client.xpending(stream, keys.JOBS_GROUP)["consumers"]:
                holders.append(consumer["name"].decode())
    return holders


def ready(base_url: str) -> dict:
    """The gateway's /ready body ({} when it does not answer)."""
    return http_json(base_url + "/ready")


def stream_through_a_kill(cluster: ProcessCluster, stream: Callable[[str, dict[str, Any]], None]
                          ) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Run `stream(base_url, result)` once undisturbed, then again, killing -9 the worker that holds it once it
    has sent three pieces (stream appends their arrival times to result["times"]); returns (undisturbed,
    disturbed, the kill's monotonic time). The cluster runs two workers."""
    import os
    import signal
    import threading

    client = cluster.client  # a Redis Cluster client under REDIS_CLUSTER=1
    undisturbed: dict[str, Any] = {}
    stream(cluster.base_url, undisturbed)
    assert "error" not in undisturbed and len(undisturbed["times"]) > 20, undisturbed.get("error")
    disturbed: dict[str, Any] = {}
    thread = threading.Thread(target=stream, args=(cluster.base_url, disturbed))
    thread.start()
    wait_until(lambda: len(disturbed.get("times", [])) >= 3, 120, "the stream to start")

    def holders() -> list[str]:  # the load a worker publishes with its next heartbeat (every 0.5 s)
        return [w for w, load in heartbeat_loads(client).items() if load > 0]

    # the undisturbed run's worker may report its last load a moment more
    wait_until(lambda: len(holders()) == 1, 10, "one holder's heartbeat")
    victim = cluster.workers[cluster.worker_index(holders()[0])]
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(timeout=180)
    assert not thread.is_alive(), "the stream hung"
    assert "error" not in disturbed, disturbed["error"]
    assert victim.poll() is not None  # the kill landed: another worker finished the stream
    return undisturbed, disturbed, killed_at
