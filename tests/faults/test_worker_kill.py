"""kill -9 a worker mid-stream: another worker resumes every stream from the journal, and no client notices.

Real redis-server, gateway and two workers (one stream each) as processes, the official openai client: SmolLM2,
and the tiny Qwen3.5 twin (a hybrid: its recurrent state is rebuilt by the re-prefill). The same requests run
undisturbed first; after the kill, every stream's text (per choice) must be byte-identical to the undisturbed run:
greedy with logprobs and a stop string, seeded sampling with n=2.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.faults.process_cluster import MODEL, job_holders
from tests.faults.process_cluster import wait_until as _wait

pytestmark = [pytest.mark.slow, pytest.mark.integration]
REQUESTS = [  # (name, request body extras), started one after the other so each worker holds one
    ("greedy", {"temperature": 0, "max_tokens": 120, "logprobs": 2, "stop": [" the end"]}),
    ("seeded-n2", {"temperature": 0.8, "top_p": 0.95, "seed": 5, "n": 2, "max_tokens": 120}),
]


def _run(base: str, model: str, extras: dict, result: dict) -> None:
    """One streaming completion: per choice, the text, the token logprobs and the finish reason."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    texts: dict[int, str] = {}
    logprobs: dict[int, list[float]] = {}
    finish: dict[int, str] = {}
    result["times"] = []
    try:
        for chunk in client.completions.create(model=model, prompt="Tell me a story about a lighthouse keeper.",
                                               stream=True, extra_body={"ignore_eos": True}, **extras):
            result["times"].append(time.monotonic())
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + choice.text
                if choice.logprobs and choice.logprobs.token_logprobs:
                    logprobs.setdefault(choice.index, []).extend(choice.logprobs.token_logprobs)
                if choice.finish_reason:
                    finish[choice.index] = choice.finish_reason
    except (openai.APIError, httpx.HTTPError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result.update(texts=texts, logprobs=logprobs, finish=finish)


def _run_all(base: str, model: str, on_streaming=None) -> dict[str, dict]:
    results = {name: {} for name, _ in REQUESTS}
    threads = [threading.Thread(target=_run, args=(base, model, extras, results[name])) for name, extras in REQUESTS]
    for thread, (name, _) in zip(threads, REQUESTS):
        thread.start()  # the idle worker is the one blocked on the stream: it takes the next job
        _wait(lambda name=name: len(results[name].get("times", [])) >= 2, 120, f"{name} to stream")
    if on_streaming is not None:
        _wait(lambda: all(len(r.get("times", [])) >= 3 for r in results.values()), 120, "every stream to stream")
        on_streaming()
    for thread in threads:
        thread.join(timeout=180)
        assert not thread.is_alive(), "a stream hung"
    return results


@pytest.mark.parametrize("served", [MODEL, "qwen35-twin"])
def test_kill_9_mid_stream_is_invisible(start_cluster, served: str, twin_path: Callable[[str, str], Path],
                                        tmp_path: Path) -> None:
    model = served
    if served != MODEL:  # the hybrid twin, served under its file's name
        model = str(tmp_path / f"{served}.gguf")
        os.symlink(twin_path("qwen35", "Q4_K_M"), model)
    cluster = start_cluster(2, model, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5",
                            LLMFLEET_HEARTBEAT_TTL_S="2", LLMFLEET_LEASE_S="30")
    base, workers, client = cluster.base_url, cluster.workers, redis.Redis.from_url(cluster.redis.url)
    undisturbed = _run_all(base, served)
    assert all("error" not in r for r in undisturbed.values()), undisturbed
    # start the second round from two idle workers (placement counts pending entries), so each gets one stream
    _wait(lambda: not job_holders(client, served), 10, "both workers to hold nothing")
    killed_at: list[float] = []

    def kill_a_worker() -> None:  # pending entries, read now (a heartbeat's load is up to an interval late)
        _wait(lambda: len(set(job_holders(client, served))) == 2, 15, "both workers to hold a stream")
        os.kill(workers[0].pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    disturbed = _run_all(base, served, kill_a_worker)
    for name, _ in REQUESTS:
        got, want = disturbed[name], undisturbed[name]
        assert "error" not in got, f"{name}: {got.get('error')}"
        assert got["texts"] == want["texts"], f"{name}: the resumed text differs"
        assert got["finish"] == want["finish"], name
        for index, values in want["logprobs"].items():
            assert got["logprobs"][index] == pytest.approx(values, abs=1e-3), f"{name} logprobs"
    # failover: the longest silence of any stream after the kill (TTL 2 s + reclaim <= 1 s + re-prefill)
    gaps = [b - a for r in disturbed.values() for a, b in zip(r["times"], r["times"][1:]) if b > killed_at[0]]
    assert max(gaps) < 6, f"a stream was silent for {max(gaps):.1f}s"
    assert workers[0].poll() is not None and workers[1].poll() is None
