"""Redis at maxmemory (noeviction: every write that would grow memory refused with OOM) for 15 s under 8 open
streams, on a real redis-server (`CONFIG SET maxmemory`), gateway and two SmolLM2 workers as processes.

Redis answers throughout, so nothing is unreachable: the workers' heartbeats and the journal appends are refused,
not lost. Every stream completes with the text of an undisturbed run, none is dead-lettered (a taking Redis
refused never counts toward it, and no worker takes another's jobs while heartbeats are refused), and a new request
gets a 503 with Retry-After whose message says Redis is full.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
import redis

from shared import keys
from tests.faults.process_cluster import MODEL

pytestmark = [pytest.mark.slow, pytest.mark.integration]
FULL_S = 15.0
STREAMS = 8
PROMPTS = ["Once upon a time", "The city at night", "In the year 2100", "A recipe for bread"]


def _stream(base: str, index: int, result: dict) -> None:
    """One long streaming completion: its chunk count as it goes, its text and the error it ended with."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    result["chunks"], result["text"] = 0, ""
    try:
        for chunk in client.completions.create(model=MODEL, prompt=PROMPTS[index % len(PROMPTS)], stream=True,
                                               temperature=0, max_tokens=160, extra_body={"ignore_eos": True}):
            result["chunks"] += 1
            result["text"] += "".join(c.text for c in chunk.choices)
    except (openai.APIError, httpx.HTTPError) as exc:
        result["error"] = exc


def _run(base: str, results: list[dict]) -> list[threading.Thread]:
    threads = [threading.Thread(target=_stream, args=(base, i, results[i])) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    return threads


def test_a_full_redis_loses_no_stream_and_says_it_is_full(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4")
    client = redis.Redis.from_url(cluster.redis.url)
    reference: list[dict] = [{} for _ in range(STREAMS)]
    for thread in _run(cluster.base_url, reference):  # undisturbed (also compiles the kernels)
        thread.join(timeout=300)
    assert all("error" not in r and r["text"] for r in reference), reference

    results: list[dict] = [{} for _ in range(STREAMS)]
    threads = _run(cluster.base_url, results)
    deadline = time.monotonic() + 120
    while min(r.get("chunks", 0) for r in results) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(r["chunks"] >= 5 for r in results), "the streams did not start"
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    full_since, refusals, early = time.monotonic(), [], None
    try:
        while time.monotonic() < full_since + FULL_S:
            time.sleep(1.0)
            reply = httpx.post(cluster.base_url + "/v1/completions", timeout=30,
                               json={"model": MODEL, "prompt": "Hello", "max_tokens": 2})
            refusals.append((reply.status_code, reply.headers.get("retry-after"),
                             reply.json().get("error", {}).get("message", "")))
            early = early or [r["chunks"] for r in results]
        late = [r["chunks"] for r in results]
    finally:
        client.config_set("maxmemory", 0)
    for thread in threads:
        thread.join(timeout=240)
    assert not any(thread.is_alive() for thread in threads), "a stream hung"

    assert all(status == 503 and retry for status, retry, _m in refusals), refusals
    assert all("Redis is full (OOM" in message and "cannot be reached" not in message for *_s, message in refusals)
    assert [r.get("error") for r in results] == [None] * STREAMS
    assert [r["text"] for r in results] == [r["text"] for r in reference]  # 8/8 identical to the undisturbed run
    assert client.xlen(keys.deadletter_stream(MODEL)) == 0
    assert early == late  # nothing got out while Redis was full: the events waited in the workers, and resumed
