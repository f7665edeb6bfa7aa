"""kill -9 the worker holding an Ollama stream: another worker resumes it from the journal and the ollama client
sees one unbroken NDJSON stream, identical to an undisturbed run (real Redis, gateway, two SmolLM2 workers)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import redis
from process_cluster import MODEL, heartbeat_loads
from process_cluster import wait_until as _wait

ollama = pytest.importorskip("ollama")
pytestmark = [pytest.mark.slow, pytest.mark.integration]
ASK = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and his cat."}]


def _stream(base: str, result: dict[str, Any]) -> None:
    """One greedy streamed chat: its pieces, their arrival times and its last object."""
    client = ollama.Client(host=base, timeout=120)
    result["pieces"], result["times"] = [], []
    try:
        for part in client.chat(model=MODEL, messages=ASK, stream=True, options={"temperature": 0,
                                                                                 "num_predict": 120}):
            if part.done:
                result["last"] = part
            else:
                result["pieces"].append(part.message.content)
                result["times"].append(time.monotonic())
    except (ollama.ResponseError, OSError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"


def test_kill_9_of_the_worker_holding_an_ollama_stream_is_invisible(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="2",
                            LLMFLEET_LEASE_S="30")
    client = redis.Redis.from_url(cluster.redis.url)
    undisturbed: dict[str, Any] = {}
    _stream(cluster.base_url, undisturbed)
    assert "error" not in undisturbed and len(undisturbed["times"]) > 20, undisturbed.get("error")

    disturbed: dict[str, Any] = {}
    thread = threading.Thread(target=_stream, args=(cluster.base_url, disturbed))
    thread.start()
    _wait(lambda: len(disturbed.get("times", [])) >= 3, 120, "the stream to start")

    def holders() -> list[str]:  # the load a worker publishes with its next heartbeat (every 0.5 s)
        return [w for w, load in heartbeat_loads(client).items() if load > 0]

    _wait(lambda: bool(holders()), 10, "the holder's heartbeat")
    assert len(holders()) == 1, holders()
    victim = cluster.workers[cluster.worker_index(holders()[0])]
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(timeout=180)
    assert not thread.is_alive(), "the stream hung"

    assert "error" not in disturbed, disturbed["error"]
    got, want = disturbed["last"], undisturbed["last"]
    assert "".join(disturbed["pieces"]) == "".join(undisturbed["pieces"])
    assert (got.done_reason, got.eval_count, got.prompt_eval_count) == (want.done_reason, want.eval_count,
                                                                         want.prompt_eval_count)
    gaps = [b - a for a, b in zip(disturbed["times"], disturbed["times"][1:]) if b > killed_at]
    assert max(gaps, default=0) < 6, f"the stream was silent for {max(gaps):.1f}s"
    assert victim.poll() is not None
