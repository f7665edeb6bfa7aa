"""deploy/k8s's autoscaling on a real cluster (Redis, a gateway, SmolLM2 workers as processes): what the KEDA
triggers read, and what a scale-down (SIGTERM to one busy worker) does.

KEDA's pendingEntriesCount trigger runs XPENDING <stream> <group> (the summary count), its streamLength trigger
XLEN <stream>. Under load the first must count the jobs the workers hold (never more than their slots, which is
why the ScaledObject's target stays under LLMFLEET_SLOTS) and the second held plus waiting jobs; both drop to 0
when the model is idle, since workers delete a job's entry when they ack it.
KEDA's metrics-api trigger reads the gateway's /metrics (format prometheus) and takes the sample its
valueLocation selects: llmfleet_model_jobs, every job of the model waiting or held over its shared and
per-worker streams; the redis-streams triggers (a fallback while no gateway answers) see the shared streams only.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmfleet.local_cluster import LocalCluster
from shared import keys
from tests.deploy.kustomize_lite import render
from tests.support.cluster import start_process_cluster
from tests.support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
SLOTS = 2
ROOT = Path(__file__).resolve().parents[2]
WORKER = "llmfleet-worker-smollm2-135m"


class Cluster:
    """A running gateway and its workers, and a client of their Redis."""

    def __init__(self, running: LocalCluster) -> None:
        self.base_url = running.base_url
        self.redis = running.client
        self.workers = running.workers

    def read_triggers(self) -> tuple[int, int]:
        """(XPENDING count, XLEN plus the fair queue's jobs) of the model's stream, in one MULTI so that no ack
        falls between the reads: with fair shares on (the default) the backlog waits in the class's fair queue,
        which the gauge the metrics-api trigger reads counts (the redis-streams fallback sees the stream only)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.xpending(keys.jobs_stream(MODEL), keys.JOBS_GROUP)
        pipe.xlen(keys.jobs_stream(MODEL))
        pipe.zcard(keys.fair_keys(MODEL)[0])
        pending, length, fair = pipe.execute()
        return pending["pending"], length + fair

    def held_jobs(self) -> int:
        """Jobs the workers hold, over the model's shared and per-worker streams (with two workers, placement
        puts a job on a worker's own stream, which the shared stream's XPENDING does not count)."""
        streams = [*keys.jobs_streams(MODEL)] + [s for w in self.redis.smembers(keys.placed_workers(MODEL))
                                                 for s in keys.worker_jobs_streams(MODEL, w.decode())]
        return sum(self.redis.xpending(s, keys.JOBS_GROUP)["pending"] for s in streams if self.redis.exists(s))

    def ask_in_background(self, count: int, max_tokens: int, finishes: list[tuple[str, int]]) -> list[threading.Thread]:
        """Start `count` completions (ignore_eos, so each runs max_tokens); each appends (finish, tokens)."""
        from openai import OpenAI

        client = OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)

        def ask(i: int) -> None:
            reply = client.completions.create(model=MODEL, prompt=f"Count to {i + 20}:", max_tokens=max_tokens,
                                              temperature=0, extra_body={"ignore_eos": True})
            finishes.append((reply.choices[0].finish_reason, reply.usage.completion_tokens))

        threads = [threading.Thread(target=ask, args=(len(finishes) + i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        return threads


@pytest.fixture()
def start_cluster(redis_server, smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[Callable[[int], Cluster]]:
    """A factory: a gateway and N workers with SLOTS slots each against a real Redis, all stopped afterwards."""
    started: list[LocalCluster] = []

    def start(workers: int) -> Cluster:
        started.append(start_process_cluster(tmp_path, workers, redis_url=redis_server.url, LLMFLEET_SLOTS=str(SLOTS),
                                             LLMFLEET_KV_BUDGET_MIB="256", LLMFLEET_LOG_LEVEL="WARNING"))
        return Cluster(started[-1])

    try:
        yield start
    finally:
        for running in started:
            running.close()


def _manifest(kind: str, name: str) -> dict:
    return next(d for d in render(ROOT / "deploy/k8s/base") if d["kind"] == kind and d["metadata"]["name"] == name)


def test_the_triggers_read_held_and_waiting_jobs(start_cluster: Callable[[int], Cluster]) -> None:
    streams = {t["metadata"]["stream"] for t in _manifest("ScaledObject", WORKER)["spec"]["triggers"]
               if t["type"] == "redis-streams"}
    assert streams == set(keys.jobs_streams(MODEL))
    cluster = start_cluster(1)
    finishes: list[tuple[str, int]] = []
    samples: list[tuple[int, int]] = []  # (XPENDING count, XLEN) as KEDA reads them
    started = time.monotonic()
    threads = cluster.ask_in_background(6, 24, finishes)
    while any(t.is_alive() for t in threads):
        samples.append(cluster.read_triggers())
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    assert finishes == [("length", 24)] * 6
    peak_pending, peak_length = max(s[0] for s in samples), max(s[1] for s in samples)
    print(f"\n6 requests on {SLOTS} slots in {elapsed:.1f}s; {len(samples)} samples: peak XPENDING "
          f"{peak_pending}, peak XLEN {peak_length}")
    assert peak_pending == SLOTS  # the held jobs: a worker takes no more than its slots
    assert all(pending <= length for pending, length in samples)
    assert peak_length >= 5  # the backlog shows in the stream's length and its fair queue, not in XPENDING
    wait_until(lambda: cluster.read_triggers() == (0, 0), 5, "an idle stream")  # the last ack may trail its reply


def test_a_scaled_down_worker_finishes_its_streams_within_the_grace_period(
        start_cluster: Callable[[int], Cluster]) -> None:
    grace = _manifest("Deployment", WORKER)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    cluster = start_cluster(2)
    finishes: list[tuple[str, int]] = []
    threads = cluster.ask_in_background(2 * SLOTS, 32, finishes)
    wait_until(lambda: cluster.held_jobs() == 2 * SLOTS, 60, "both workers to hold their slots")
    victim = cluster.workers[0]
    victim.send_signal(signal.SIGTERM)  # what the kubelet does to a pod KEDA's HPA scales away
    stopped = time.monotonic()
    threads += cluster.ask_in_background(SLOTS, 32, finishes)  # arriving during the drain: the other worker's
    exit_code = victim.wait(timeout=grace)  # past the grace period the kubelet would SIGKILL it
    drained_s = time.monotonic() - stopped
    for thread in threads:
        thread.join(timeout=300)
    print(f"\nthe SIGTERM'd worker finished its {SLOTS} streams and exited in {drained_s:.1f}s "
          f"(grace {grace}s); {len(finishes)} requests done")
    assert exit_code == 0
    assert finishes == [("length", 32)] * (3 * SLOTS)  # every stream complete, none cut by the scale-down
    assert cluster.workers[1].poll() is None and cluster.redis.zcard(keys.WORKERS_INDEX) == 1  # deregistered


def _jobs_metric(base: str, selector: str) -> float | None:
    """What KEDA's metrics-api trigger (format prometheus) reads: the /metrics sample the selector names."""
    name, _, labels = selector.partition("{")
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', labels))
    for family in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                return sample.value
    return None


def test_the_jobs_metric_counts_jobs_on_the_workers_own_streams(start_cluster: Callable[[int], Cluster]) -> None:
    selector = next(t for t in _manifest("ScaledObject", WORKER)["spec"]["triggers"]
                    if t["type"] == "metrics-api")["metadata"]["valueLocation"]
    cluster = start_cluster(2)  # two workers: placement writes most jobs to a worker's own stream
    finishes: list[tuple[str, int]] = []
    samples: list[tuple[float, int, int]] = []  # (the metric, shared XPENDING, shared XLEN)
    threads = cluster.ask_in_background(3 * SLOTS, 24, finishes)
    while any(t.is_alive() for t in threads):
        samples.append((_jobs_metric(cluster.base_url, selector) or 0.0, *cluster.read_triggers()))
        time.sleep(0.05)
    assert finishes == [("length", 24)] * (3 * SLOTS)
    peak_metric, peak_shared = max(s[0] for s in samples), max(max(s[1], s[2]) for s in samples)
    print(f"\n{3 * SLOTS} requests on 2 workers x {SLOTS} slots: llmfleet_model_jobs peaked at {peak_metric:.0f}, "
          f"the shared stream's XPENDING/XLEN at {peak_shared}")
    assert peak_metric >= 2 * SLOTS  # at least every held job, wherever it was queued
    assert peak_shared < peak_metric  # what the redis-streams triggers alone would have scaled on
    wait_until(lambda: _jobs_metric(cluster.base_url, selector) == 0, 10, "the metric to drop to 0 when idle")
