"""What KEDA's redis-streams triggers read (deploy/k8s), measured on a real cluster: Redis, a gateway, a SmolLM2 worker.

KEDA's pendingEntriesCount trigger runs XPENDING <stream> <group> (the summary count), its streamLength trigger
XLEN <stream>. Under load the first must count the jobs the workers hold (never more than their slots, which is
why the ScaledObject's target stays under LLMFLEET_SLOTS) and the second held plus waiting jobs; both drop to 0
when the model is idle, since workers delete a job's entry when they ack it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from kustomize_lite import render

from llmfleet.redis_server import free_port
from shared import keys

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
SLOTS = 2
REQUESTS = 6
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def cluster(redis_server, smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[str]:
    """A gateway and one worker with SLOTS slots against a real Redis; yields the gateway's URL."""
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_server.url, "LLMFLEET_PORT": str(port), "LLMFLEET_SLOTS": str(SLOTS),
           "LLMFLEET_THREADS": "1", "LLMFLEET_REGISTRY_CACHE_S": "0", "LLMFLEET_LOG_LEVEL": "WARNING"}
    procs = []
    for name, args in (("gateway", ["gateway"]), ("worker", ["worker", "--model", MODEL])):
        with (tmp_path / f"{name}.log").open("wb") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "llmfleet.cli", *args], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while not _ready(base):
            assert time.monotonic() < deadline, "the gateway and the worker did not get ready"
            assert all(p.poll() is None for p in procs), "a process died at start-up (see its log)"
            time.sleep(0.2)
        yield base
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _ready(base: str) -> bool:
    try:
        return httpx.get(base + "/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_triggers_read_held_and_waiting_jobs(cluster: str, redis_server) -> None:
    from openai import OpenAI

    [trigger_stream] = {t["metadata"]["stream"] for d in render(ROOT / "deploy/k8s/base")
                        if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]}
    assert trigger_stream == keys.jobs_stream(MODEL)
    client = OpenAI(base_url=cluster + "/v1", api_key="unused", max_retries=0)
    r = redis.Redis.from_url(redis_server.url)
    finishes: list[str] = []

    def ask(i: int) -> None:
        reply = client.completions.create(model=MODEL, prompt=f"Count to {i + 20}:", max_tokens=24, temperature=0,
                                          extra_body={"ignore_eos": True})
        finishes.append(reply.choices[0].finish_reason)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(REQUESTS)]
    samples: list[tuple[int, int]] = []  # (XPENDING count, XLEN) as KEDA reads them
    started = time.monotonic()
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        samples.append(_read_triggers(r, trigger_stream))
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    assert finishes == ["length"] * REQUESTS
    peak_pending, peak_length = max(s[0] for s in samples), max(s[1] for s in samples)
    print(f"\n{REQUESTS} requests on {SLOTS} slots in {elapsed:.1f}s; {len(samples)} samples: peak XPENDING "
          f"{peak_pending}, peak XLEN {peak_length}")
    assert peak_pending == SLOTS  # the held jobs: a worker takes no more than its slots
    assert all(pending <= length for pending, length in samples)
    assert peak_length >= REQUESTS - 1  # the backlog shows only in the stream's length
    deadline = time.monotonic() + 5
    while _read_triggers(r, trigger_stream) != (0, 0):  # the last ack may land just after its reply
        assert time.monotonic() < deadline, _read_triggers(r, trigger_stream)
        time.sleep(0.05)


def _read_triggers(r: redis.Redis, stream: str) -> tuple[int, int]:
    """(XPENDING count, XLEN) in one MULTI, so that no ack falls between the two reads."""
    pipe = r.pipeline(transaction=True)
    pipe.xpending(stream, keys.JOBS_GROUP)
    pipe.xlen(stream)
    pending, length = pipe.execute()
    return pending["pending"], length
