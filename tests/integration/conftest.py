"""The cluster as processes, as docker-compose runs it: one Redis, one gateway, two SmolLM2 workers
(tests/support's process cluster, one per session)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.local_cluster import LocalCluster
from tests.support.cluster import start_process_cluster

SLOTS = 4
QUEUE_LIMIT = 4


@pytest.fixture(scope="session")
def cluster(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Start Redis, `llmfleet gateway` and two `llmfleet worker` processes; stop them all afterwards."""
    running = start_process_cluster(
        tmp_path_factory.mktemp("cluster-logs"), 2, LLMFLEET_HOST="127.0.0.1", LLMFLEET_SLOTS=str(SLOTS),
        LLMFLEET_QUEUE_LIMIT=str(QUEUE_LIMIT), LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="5",
        LLMFLEET_LEASE_S="10", LLMFLEET_LOG_LEVEL="WARNING")
    try:
        yield running
    finally:
        running.close()
