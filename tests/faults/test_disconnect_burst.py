"""A burst of clients that disconnect at random 0-400 ms after sending: none of their jobs keeps running.

Real redis-server, gateway and two SmolLM2 workers as processes. 60 clients (streaming and not) send long
requests and hang up at a random moment: before their job is written, while it is queued, while it is being
taken or while it runs. 2 s after the last one left (plus one full decode step of the worker, as it measured it
at start: a cancel takes effect at a step boundary, and a step on a loaded 2-core test box can be long), no worker
runs a sequence (the heartbeat's `stat.active`), no job waits or is held in any stream, and the gateway logged no
ERROR. Repeated three times on one cluster.
"""

from __future__ import annotations

import random
import re
import threading
import time

import httpx
import pytest
import redis

from shared import keys
from tests.faults.process_cluster import MODEL, ProcessCluster, model_streams

pytestmark = [pytest.mark.slow, pytest.mark.integration]
CLIENTS = 60
SLOTS = 8
ROUNDS = 3


def _leave_early(base: str, index: int, delay_s: float) -> None:
    """Send a long request and hang up after `delay_s`, whatever has come back by then."""
    body = {"model": MODEL, "max_tokens": 200, "temperature": 0, "stream": index % 2 == 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Count slowly to a thousand, client {index}."}]}
    with httpx.Client(timeout=httpx.Timeout(10.0)) as client:
        try:
            with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
                deadline = time.monotonic() + delay_s
                for _ in response.iter_raw():
                    if time.monotonic() >= deadline:
                        break
        except httpx.HTTPError:
            pass  # the hang-up itself, or the time-out of a request that never answered before it


def _burst(base: str, rng: random.Random) -> None:
    threads = [threading.Thread(target=_leave_early, args=(base, i, rng.uniform(0.0, 0.4))) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)


def _running(client: redis.Redis) -> dict[str, float]:
    ids = [w.decode() for w in client.zrange(keys.WORKERS_INDEX, 0, -1)]
    return {w: float(client.hget(keys.worker_key(w), "stat.active") or 0) for w in ids}


def _open_jobs(client: redis.Redis) -> int:
    """Jobs in any job stream of the model (waiting, or taken and not yet acked: acked ones are deleted) or waiting
    in a fair queue for their tenant's turn."""
    fair = sum(client.zcard(keys.fair_keys(MODEL, priority)[0]) for priority in keys.PRIORITY_ORDER)
    return fair + sum(client.xlen(stream) for stream in model_streams(client))  # the shared and per-worker streams


def _full_step_s(cluster: ProcessCluster) -> float:
    """The longest full decode step (slots / measured tokens per second) any worker logged at start."""
    rates = [float(m) for log in cluster.logs
             for m in re.findall(r"a full decode step runs at ([0-9.]+) tokens/s", log.read_text(errors="replace"))]
    return max(SLOTS / rate for rate in rates)


def test_a_burst_of_early_disconnects_leaves_nothing_running(start_cluster, tmp_path) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS=str(SLOTS), LLMFLEET_HEARTBEAT_INTERVAL_S="0.25",
                            LLMFLEET_HEARTBEAT_TTL_S="2", LLMFLEET_REQUEST_TIMEOUT_S="3600",  # admit a long queue
                            LLMFLEET_ORPHAN_GRACE_S="0")  # no resume window: a stream left is cancelled at once
    client = redis.Redis.from_url(cluster.redis.url)
    httpx.post(cluster.base_url + "/v1/completions", timeout=120,  # the first prefill compiles its kernels
               json={"model": MODEL, "prompt": "Warm up", "max_tokens": 2}).raise_for_status()
    bound = 2.0 + _full_step_s(cluster) + 0.25  # 2 s + one step + one heartbeat (the gauge's age)
    rng = random.Random(25)
    for round_ in range(ROUNDS):
        _burst(cluster.base_url, rng)
        left = time.monotonic()
        while sum(_running(client).values()) and time.monotonic() - left < bound:
            time.sleep(0.05)
        print(f"round {round_}: nothing running {time.monotonic() - left:.2f}s after the last client left "
              f"(bound {bound:.2f}s)")
        assert sum(_running(client).values()) == 0, f"round {round_}: sequences still running: {_running(client)}"
        # the jobs still waiting are ended (cancelled, never started) as the workers take them
        while _open_jobs(client) and time.monotonic() - left < bound + 5:
            time.sleep(0.05)
        assert _open_jobs(client) == 0, f"round {round_}: jobs still open"
        assert sum(_running(client).values()) == 0, f"round {round_}: a waiting job started: {_running(client)}"
    gateway_log = (tmp_path / "gateway.log").read_text(errors="replace")
    assert "ERROR" not in gateway_log and "Traceback" not in gateway_log, gateway_log[-3000:]
