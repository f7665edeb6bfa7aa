"""Scale to zero: no worker of a known model is alive, a streaming request arrives and is queued (`: queued`, then
keep-alives), a worker is started 10 s later: it takes the job and the request is served. Real redis-server,
gateway and SmolLM2 worker as processes."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import redis

from shared import keys
from tests.faults.process_cluster import MODEL

pytestmark = [pytest.mark.slow, pytest.mark.integration]
KEEPALIVE_S = 1.0


def _stream(base: str, result: dict) -> None:
    """One streaming completion, read line by line: each SSE comment and data line with its arrival time."""
    result["lines"] = []
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=180) as response:
        result["status"] = response.status_code
        for line in response.iter_lines():
            if line:
                result["lines"].append((time.monotonic(), line))
    result["ended"] = time.monotonic()


def test_a_request_waits_for_the_first_worker_and_is_served(start_cluster) -> None:
    cluster = start_cluster(0, LLMFLEET_WORKER_WAIT_S="120", LLMFLEET_SSE_KEEPALIVE_S=str(KEEPALIVE_S))
    client = redis.Redis.from_url(cluster.redis_url)
    client.zadd(keys.MODELS_INDEX, {MODEL: time.time() - 60})  # it had a worker a minute ago: scaled to zero since
    result: dict = {}
    thread = threading.Thread(target=_stream, args=(cluster.base_url, result))
    sent = time.monotonic()
    thread.start()
    time.sleep(10)
    assert thread.is_alive() and result.get("status") == 200  # queued and held, not refused
    jobs = httpx.get(cluster.base_url + "/metrics").text
    assert f'llmfleet_model_jobs{{model="{MODEL}"}} 1.0' in jobs  # what an autoscaler starts the worker for
    cluster.start_worker()
    thread.join(timeout=170)
    assert not thread.is_alive(), "the stream hung"
    lines = result["lines"]
    assert lines[0][1] == ": queued" and lines[-1][1] == "data: [DONE]"
    data = [json.loads(line[6:]) for _t, line in lines if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in data if c["choices"])  # served
    assert not any("error" in c for c in data)
    times = [sent] + [t for t, _line in lines]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < KEEPALIVE_S + 1.5  # never silent
    assert sum(1 for _t, line in lines if line == ": keep-alive") >= 8
