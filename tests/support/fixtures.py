"""The fixtures of tests/support, for every test (tests/conftest.py registers this module as a plugin)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmfleet.local_cluster import LocalCluster
from tests.support.batches import aredis, sredis
from tests.support.cluster import MODEL, start_process_cluster

__all__ = ["aredis", "process_cluster", "sredis"]


@pytest.fixture()
def process_cluster(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """A factory: start Redis, a gateway and N workers (`start_process_cluster`'s arguments: model, worker_ids,
    redis_url, env settings); every cluster it started stops afterwards."""
    clusters: list[LocalCluster] = []

    def start(workers: int, model: str = MODEL, worker_ids: list[str] | None = None, **settings: str) -> LocalCluster:
        logdir = tmp_path / f"cluster-{len(clusters)}" if clusters else tmp_path
        cluster = start_process_cluster(logdir, workers, model=model, worker_ids=worker_ids, **settings)
        clusters.append(cluster)
        return cluster

    try:
        yield start
    finally:
        for cluster in clusters:
            cluster.close()
