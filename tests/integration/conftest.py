"""The clusters as processes, one of each per session: `cluster` as docker-compose runs it (one Redis, one
gateway, two SmolLM2 workers: tests/support's process cluster), and `embedding_fleet` (a BERT embedding model
beside a chat model that opts in to causal embeddings, and a batch runner)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.local_cluster import LocalCluster
from tests.support.batches import start_batch_runner
from tests.support.cluster import process_cluster_redis, start_process_cluster

SLOTS = 4
QUEUE_LIMIT = 4
EMBEDDER = "all-minilm-l6-v2"
CHAT_MODEL = "smollm2-135m"


@pytest.fixture(scope="session")
def cluster(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Start Redis, `llmfleet gateway` and two `llmfleet worker` processes; stop them all afterwards."""
    running = start_process_cluster(
        tmp_path_factory.mktemp("cluster-logs"), 2, LLMFLEET_HOST="127.0.0.1", LLMFLEET_SLOTS=str(SLOTS),
        LLMFLEET_QUEUE_LIMIT=str(QUEUE_LIMIT), LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="5",
        LLMFLEET_LEASE_S="10", LLMFLEET_LOG_LEVEL="WARNING",
        LLMFLEET_ORPHAN_GRACE_S="2")  # a stream left is cancelled 2 s later (test_disconnect_frees_the_worker_slot)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="session")
def embedding_fleet(minilm_f32_path: Path, smollm2_gguf_path: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Redis, a gateway, an all-MiniLM-L6-v2 worker, a SmolLM2 worker and a batch runner as processes, with
    LLMFLEET_CAUSAL_EMBEDDINGS=1 (SmolLM2 also embeds, by pooling its hidden states); yields the base URL."""
    fleet = process_cluster_redis(tmp_path_factory.mktemp("embedding-fleet-logs"), LLMFLEET_HOST="127.0.0.1",
                                  LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="5",
                                  LLMFLEET_KV_BUDGET_MIB="64", LLMFLEET_CAUSAL_EMBEDDINGS="1",
                                  LLMFLEET_LOG_LEVEL="WARNING")
    try:
        fleet.start_gateway()
        fleet.start_worker(model=EMBEDDER)
        fleet.start_worker(model=CHAT_MODEL)
        start_batch_runner(fleet)
        fleet.wait_ready(2)
        yield fleet.base_url
    finally:
        fleet.close()
