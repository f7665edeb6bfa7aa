"""Prefix-aware placement with real processes: a redis-server, a gateway, two SmolLM2 workers, the openai client.

Requests sharing a system prompt land on the worker that has it cached (its usage reports the cached tokens);
jobs placed on a worker that stops are stolen by the other once overdue, and a worker killed with jobs waiting
on its own stream (and one in flight) has them drained by the other: every request ends, exactly once; a
burst of new streams splits evenly over two idle workers, every time.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.cluster.placement import TIER_SEP, prefix_chain, prompt_text
from shared import keys
from shared.messages import ChatMessage, GenerateJob
from tests.faults.process_cluster import MODEL, ProcessCluster, heartbeat_loads, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]
BODY = ("Answer in one short sentence. Be precise, polite and brief. Never invent facts about ships, tides, "
        "weather or cargo; say so when you do not know. ")


def _system(topic: str) -> str:
    """A ~1,300-character system prompt that differs from the others from its first characters."""
    return f"You are the {topic} assistant of the harbour office. " + BODY * 10


def _client(cluster: ProcessCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)


def _ask(cluster: ProcessCluster, system: str, question: str, **extra: Any) -> Any:
    return _client(cluster).chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=3, temperature=0, **extra)


def _owner(client: redis.Redis, system: str, question: str) -> str | None:
    """The worker the gateway's prefix map names for this prompt's deepest chunk."""
    job = GenerateJob(id="x", model=MODEL, created=0, deadline=1, messages=[
        ChatMessage(role="system", content=system), ChatMessage(role="user", content=question)])
    value = client.get(keys.prefix_owner(MODEL, prefix_chain(prompt_text(job))[-1]))
    return value.decode().split(TIER_SEP)[0] if value else None  # "worker" or "worker<sep>its host KV tier"


def _waiting_on(client: redis.Redis, worker_id: str) -> int:
    """Jobs on the worker's own streams that nobody has read."""
    total = 0
    for stream in keys.worker_jobs_streams(MODEL, worker_id):
        for group in client.xinfo_groups(stream) if client.exists(stream) else []:
            last = group["last-delivered-id"].decode()
            total += len(client.xrange(stream, min="(" + last, max="+"))
    return total


def _in_threads(calls: list[Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{} for _ in calls]

    def run(call: Any, result: dict[str, Any]) -> None:
        try:
            result["reply"] = call()
        except (openai.APIError, httpx.HTTPError) as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
        result["ended"] = time.monotonic()

    threads = [threading.Thread(target=run, args=(call, result)) for call, result in zip(calls, results, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
        assert not thread.is_alive(), "a request hung"
    return results


def test_requests_sharing_a_system_prompt_hit_the_cache_of_the_worker_that_has_it(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4")
    client = redis.Redis.from_url(cluster.redis.url)
    owners = set()
    for topic in ("tides", "cargo", "weather", "pilotage"):
        system = _system(topic)
        first = _ask(cluster, system, f"What does the {topic} desk do?")
        second = _ask(cluster, system, "And who runs it?")
        assert first.usage.prompt_tokens > 250
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= 224, f"{topic}: the second request reused only {cached} prompt tokens"
        owners.add(_owner(client, system, "And who runs it?"))
    live = {w.decode() for w in client.zrange(keys.WORKERS_INDEX, 0, -1)}
    assert owners <= live and None not in owners
    metrics = httpx.get(cluster.base_url + "/metrics").text
    hits = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("llmfleet_placements_total{") and 'reason="hit"' in line)
    assert hits >= 4


def _stop_the_owner(cluster: ProcessCluster, client: redis.Redis, system: str) -> tuple[str, Any]:
    """Warm one worker with `system`, then SIGSTOP it; returns its id and process."""
    _ask(cluster, system, "Warm up.")
    owner = _owner(client, system, "Warm up.")
    assert owner is not None
    process = cluster.workers[cluster.worker_index(owner)]
    os.kill(process.pid, signal.SIGSTOP)
    return owner, process


def test_an_idle_worker_steals_jobs_overdue_on_a_stalled_workers_stream(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_TTL_S="150", LLMFLEET_LEASE_S="150",
                            LLMFLEET_STEAL_AFTER_S="1")
    client = redis.Redis.from_url(cluster.redis.url)
    system = _system("customs")
    owner, process = _stop_the_owner(cluster, client, system)
    try:
        started = time.monotonic()
        calls = [lambda i=i: _ask(cluster, system, f"Question {i}?") for i in range(3)]
        # the owner still looks live (TTL 150 s): placed on its stream, then stolen; a job its blocking read got
        # as it stopped is pending for it, never taken, and claimed after takeover.UNTAKEN_AFTER_S
        results = _in_threads(calls)
        assert all("reply" in r for r in results), results
        assert max(r["ended"] for r in results) - started < 120, "the jobs waited for the stalled worker's TTL"
        assert _waiting_on(client, owner) == 0
        thief = next(i for i in range(2) if cluster.workers[i] is not process)
        assert "placed on another worker" in cluster.logs[thief].read_text(errors="replace")
    finally:
        os.kill(process.pid, signal.SIGCONT)


def test_a_killed_workers_stream_is_drained_by_the_other_worker(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5",
                            LLMFLEET_HEARTBEAT_TTL_S="5", LLMFLEET_LEASE_S="60", LLMFLEET_STEAL_AFTER_S="120")
    client = redis.Redis.from_url(cluster.redis.url)
    system = _system("berthing")
    _ask(cluster, system, "Warm up.")
    owner = _owner(client, system, "Warm up.")
    assert owner is not None
    process = cluster.workers[cluster.worker_index(owner)]
    in_flight: dict[str, Any] = {"text": ""}

    def stream_long() -> Any:
        chunks = _client(cluster).chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": system}, {"role": "user", "content": "Tell a story."}],
            max_tokens=60, temperature=0, stream=True, extra_body={"ignore_eos": True})
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                in_flight["text"] += chunk.choices[0].delta.content
                in_flight["chunks"] = in_flight.get("chunks", 0) + 1
            if chunk.choices and chunk.choices[0].finish_reason:
                in_flight["finish"] = chunk.choices[0].finish_reason
        return in_flight

    streamed: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []
    stream_thread = threading.Thread(target=lambda: streamed.extend(_in_threads([stream_long])))
    stream_thread.start()
    wait_until(lambda: in_flight.get("chunks", 0) >= 2, 120, "the placed stream to start on its worker")
    os.kill(process.pid, signal.SIGSTOP)  # it stops reading: the next jobs wait on its own stream
    answered: list[int] = []

    def ask(i: int) -> Any:
        reply = _ask(cluster, system, f"Question {i}?")
        answered.append(i)
        return reply

    ask_thread = threading.Thread(target=lambda: asked.extend(_in_threads([lambda i=i: ask(i) for i in range(3)])))
    ask_thread.start()
    # each of the three either waits on the stopped owner's stream or (placement found it without room on a busy
    # shared machine, where its load had not been heard yet) went to the other worker and was answered
    wait_until(lambda: _waiting_on(client, owner) + len(answered) == 3, 60, "the three jobs to be placed")
    assert _waiting_on(client, owner) >= 1, "no job waits on the stopped owner's stream: nothing to drain"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    for thread in (stream_thread, ask_thread):
        thread.join(timeout=300)
        assert not thread.is_alive(), "a request hung"
    results = streamed + asked
    assert len(results) == 4 and all("reply" in r for r in results), results
    assert in_flight["finish"] == "length"  # resumed on the other worker from its journal
    for result in results[1:]:
        assert result["reply"].choices[0].finish_reason in ("stop", "length")
    assert _waiting_on(client, owner) == 0
    wait_until(lambda: not client.sismember(keys.placed_workers(MODEL), owner), 30,
               "the dead worker's empty streams to be forgotten")


def _jobs_started(cluster: ProcessCluster) -> list[int]:
    """Generation jobs each worker has started so far (its "job <id> generate" log lines)."""
    return [log.read_text(errors="replace").count(" generate model=") for log in cluster.logs]


def test_a_burst_of_new_streams_splits_evenly_over_two_idle_workers(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="16", LLMFLEET_STEAL_AFTER_S="120")
    client = redis.Redis.from_url(cluster.redis.url)

    def stream(question: str) -> Any:
        chunks = _client(cluster).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=24, temperature=0,
            stream=True, extra_body={"ignore_eos": True})
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    splits = []
    for burst in range(3):  # repeated: the split must not depend on luck
        wait_until(lambda: sum(heartbeat_loads(client).values()) == 0, 60, "both workers to be idle")
        before = _jobs_started(cluster)
        results = _in_threads([lambda i=i, b=burst: stream(f"Burst {b}, stream {i}: count to ten.") for i in range(16)])
        assert all("reply" in r for r in results), results
        split = [after - earlier for after, earlier in zip(_jobs_started(cluster), before, strict=True)]
        assert sum(split) == 16 and min(split) >= 6, f"burst {burst}: 16 new streams split {split}"
        splits.append(split)
    print(f"\n16 concurrent new streams on 2 idle workers, 3 bursts: {splits}")
