"""The host KV tier across processes (real redis-server, gateway and SmolLM2 workers): a worker killed -9 and started
again finds its prefixes warm; a stream whose worker is killed -9 mid-decode resumes on the other worker from the dead
one's blocks (prompt and generated tokens, warmed into its pool once the dead one missed two heartbeats, before the
claim) with the same text; a truncated tier file is replaced by the next worker
with one log line, and serving goes on."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import openai
import pytest
import redis

from tests.faults.process_cluster import MODEL, job_holders, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]
SYSTEM = ("You are the archivist of a maritime museum. You answer questions about lighthouses, their keepers, the "
          "ships they guided and the storms they survived, and you cite the year whenever you know it. ") * 12
SETTINGS = {"LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5", "LLMFLEET_HEARTBEAT_TTL_S": "2", "LLMFLEET_LEASE_S": "30"}


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=180)


def _complete(base: str, question: str, max_tokens: int = 8) -> tuple[str, int]:
    reply = _client(base).completions.create(model=MODEL, prompt=SYSTEM + question, max_tokens=max_tokens,
                                             temperature=0, extra_body={"ignore_eos": True})
    return reply.choices[0].text, reply.usage.prompt_tokens_details.cached_tokens


def _stats(cluster: Any, name: str) -> dict[str, float]:
    """stat.<name> of every registered worker."""
    return {e[b"model"].decode() + str(i): float(e.get(f"stat.{name}".encode(), b"0"))
            for i, e in enumerate(cluster.worker_entries())}


def test_a_worker_killed_and_started_again_finds_its_prefixes_warm(start_cluster) -> None:
    cluster = start_cluster(1, **SETTINGS)
    text, cached = _complete(cluster.base_url, "Which lighthouse is the oldest?")
    assert cached == 0
    wait_until(lambda: sum(_stats(cluster, "kv_tier_blocks_written").values()) >= 14, 30, "the tier writes")
    os.kill(cluster.workers[0].pid, signal.SIGKILL)
    cluster.workers[0].wait()
    cluster.start_worker(0)
    wait_until(lambda: len(cluster.worker_entries()) == 1 and float(
        cluster.worker_entries()[0].get(b"stat.kv_tier_bytes_total", b"0")) > 0, 120, "the new worker")
    again, cached = _complete(cluster.base_url, "Which lighthouse is the oldest?")
    assert again == text and cached >= 448
    log = cluster.logs[0].read_text(errors="replace")
    assert "Traceback" not in log and "KV tier" in log


def _stream(base: str, result: dict) -> None:
    result["times"], result["text"] = [], ""
    try:
        for chunk in _client(base).completions.create(model=MODEL, prompt=SYSTEM + "Tell me about a storm.",
                                                      max_tokens=160, temperature=0, stream=True,
                                                      extra_body={"ignore_eos": True}):
            result["times"].append(time.monotonic())
            result["text"] += chunk.choices[0].text if chunk.choices else ""
    except openai.APIError as exc:
        result["error"] = str(exc)


def test_a_failover_resumes_from_the_dead_workers_blocks(start_cluster) -> None:
    cluster = start_cluster(2, **SETTINGS)
    client = redis.Redis.from_url(cluster.redis.url)
    disturbed: dict = {}
    thread = threading.Thread(target=_stream, args=(cluster.base_url, disturbed))
    thread.start()
    wait_until(lambda: len(disturbed.get("times", [])) >= 70, 180, "70 tokens of the stream")
    holder = job_holders(client)  # the pending entries, read now (a heartbeat's load is up to an interval old)
    assert len(holder) == 1, holder
    victim = cluster.worker_index(holder[0])
    os.kill(cluster.workers[victim].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(timeout=180)
    assert "error" not in disturbed, disturbed["error"]
    silence = max(b - a for a, b in zip(disturbed["times"], disturbed["times"][1:]) if b > killed_at)
    prompt_tokens = _client(cluster.base_url).completions.create(
        model=MODEL, prompt=SYSTEM + "Tell me about a storm.", max_tokens=1).usage.prompt_tokens
    want = (prompt_tokens + 64) // 32 * 32 - 32  # the prompt's and the generated tokens' full blocks
    with contextlib.suppress(TimeoutError):  # the survivor's counters reach its registry entry with a heartbeat
        wait_until(lambda: max(_stats(cluster, "kv_tier_tokens_hit").values()) >= want, 10, "the tier hits")
    hit = max(_stats(cluster, "kv_tier_tokens_hit").values())
    survivor = cluster.logs[1 - victim].read_text(errors="replace")[-3000:]
    assert hit >= want, (hit, prompt_tokens, [_stats(cluster, n) for n in ("kv_tier_lookups", "kv_tier_blocks_written",
                                                                         "prefix_tokens_hit")], survivor)
    whole_log = cluster.logs[1 - victim].read_text(errors="replace")  # its blocks were warmed before the claim
    assert -1 < whole_log.find("missed its heartbeats; warming the takeover") < whole_log.find("took over job")
    undisturbed: dict = {}
    _stream(cluster.base_url, undisturbed)
    assert disturbed["text"] == undisturbed["text"]
    print(f"failover silence {silence:.2f}s, {hit:.0f} tokens from the tier of {prompt_tokens} + 70")


def test_a_truncated_tier_file_is_replaced_by_the_next_worker(start_cluster) -> None:
    cluster = start_cluster(1, **SETTINGS)
    text, _ = _complete(cluster.base_url, "Name a lighthouse.")
    wait_until(lambda: sum(_stats(cluster, "kv_tier_blocks_written").values()) >= 14, 30, "the tier writes")
    cluster.stop(cluster.workers[0])
    tier_dir = cluster.logdir / "kv-tier"
    (path,) = tier_dir.glob("*.kvtier")
    os.truncate(path, 10_000)
    cluster.start_worker(0)
    cluster.wait_ready(1)
    again, cached = _complete(cluster.base_url, "Name a lighthouse.")
    assert again == text and cached == 0
    log = cluster.logs[0].read_text(errors="replace")
    assert log.count("truncated (") == 1 and "Traceback" not in log
