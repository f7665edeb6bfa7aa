"""kill -9 the BERT worker holding an embeddings request: the other worker embeds it, the client gets the same vectors.

Real redis-server, gateway and two all-MiniLM-L6-v2 workers as processes, the official openai client.
"""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import openai
import pytest
import redis

from tests.faults.process_cluster import heartbeat_loads
from tests.faults.process_cluster import wait_until as _wait

pytestmark = [pytest.mark.slow, pytest.mark.integration]
EMBEDDER = "all-minilm-l6-v2"
WORDS = ["the", "keeper", "climbed", "the", "stairs", "of", "the", "old", "lighthouse", "every", "evening", "to", "light", "the", "lamp", "for", "ships"]


def texts() -> list[str]:
    """48 texts of about 300 tokens: long enough that the kill lands while the worker encodes them."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(280)) + f" {i}" for i in range(48)]


def test_kill_9_of_the_embedding_worker_is_invisible(start_cluster, minilm_f32_path) -> None:
    cluster = start_cluster(2, model=EMBEDDER, LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="2",
                            LLMFLEET_LEASE_S="30")
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    undisturbed = client.embeddings.create(model=EMBEDDER, input=texts())
    result: dict = {}

    def embed() -> None:
        try:
            result["reply"] = client.embeddings.create(model=EMBEDDER, input=texts())
        except openai.APIError as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=embed)
    thread.start()
    store = redis.Redis.from_url(cluster.redis.url)
    _wait(lambda: any(heartbeat_loads(store).values()), 60, "a worker to hold the request")
    holder = next(w for w, load in heartbeat_loads(store).items() if load)
    victim = cluster.workers[cluster.worker_index(holder)]
    os.kill(victim.pid, signal.SIGKILL)
    thread.join(timeout=240)
    assert not thread.is_alive(), "the request hung after the kill"
    assert "error" not in result, result.get("error")
    got = np.array([d.embedding for d in result["reply"].data])
    want = np.array([d.embedding for d in undisturbed.data])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert victim.poll() is not None and sum(w.poll() is None for w in cluster.workers) == 1
