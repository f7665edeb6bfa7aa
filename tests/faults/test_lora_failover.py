"""kill -9 the worker holding a stream that runs under a LoRA adapter: the worker that resumes it applies the same
adapter (it rides in the job), so the openai client's text is identical to an undisturbed run's, and differs
from the base model's (real Redis, gateway, two SmolLM2 workers, style-a loaded at runtime on both)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from tests.faults.process_cluster import MODEL, heartbeat_loads
from tests.faults.process_cluster import wait_until as _wait

pytestmark = [pytest.mark.slow, pytest.mark.integration]
PROMPT = "Once upon a time, in a lighthouse by the sea,"


def _stream(base: str, model: str, result: dict[str, Any]) -> None:
    """One greedy streamed completion: its text and the arrival time of each chunk."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    result["text"], result["times"] = "", []
    try:
        for chunk in client.completions.create(model=model, prompt=PROMPT, max_tokens=80, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            result["text"] += chunk.choices[0].text if chunk.choices else ""
            result["times"].append(time.monotonic())
    except openai.APIError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"


def test_kill_9_mid_stream_resumes_with_the_same_adapter(start_cluster, lora_fixtures: Path) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="2",
                            LLMFLEET_LEASE_S="30")
    loaded = httpx.post(cluster.base_url + "/admin/loras", timeout=60,
                        json={"model": MODEL, "name": "style-a", "path": str(lora_fixtures / "style-a.gguf")})
    assert loaded.status_code == 201 and len(loaded.json()["loaded_by"]) == 2, loaded.text
    client = redis.Redis.from_url(cluster.redis.url)
    base: dict[str, Any] = {}
    _stream(cluster.base_url, MODEL, base)
    undisturbed: dict[str, Any] = {}
    _stream(cluster.base_url, f"{MODEL}:style-a", undisturbed)
    assert "error" not in undisturbed and len(undisturbed["times"]) > 40, undisturbed.get("error")
    assert undisturbed["text"] != base["text"]

    disturbed: dict[str, Any] = {}
    thread = threading.Thread(target=_stream, args=(cluster.base_url, f"{MODEL}:style-a", disturbed))
    thread.start()
    _wait(lambda: len(disturbed.get("times", [])) >= 3, 120, "the stream to start")

    def holders() -> list[str]:  # the load a worker publishes with its next heartbeat (every 0.5 s)
        return [w for w, load in heartbeat_loads(client).items() if load > 0]

    _wait(lambda: len(holders()) == 1, 10, "one holder's heartbeat")  # the other may report its last load a moment more
    victim = cluster.workers[cluster.worker_index(holders()[0])]
    os.kill(victim.pid, signal.SIGKILL)
    thread.join(timeout=180)
    assert not thread.is_alive(), "the stream hung"
    assert "error" not in disturbed, disturbed["error"]
    assert disturbed["text"] == undisturbed["text"]
    assert victim.poll() is not None
