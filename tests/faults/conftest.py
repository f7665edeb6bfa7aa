"""Real-process clusters for the fault tests: a redis-server, a gateway and SmolLM2 workers as processes
(tests/support's process_cluster)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llmfleet.local_cluster import LocalCluster
from tests.faults.process_cluster import MODEL


@pytest.fixture()
def start_cluster(process_cluster: Callable[..., LocalCluster]) -> Callable[..., LocalCluster]:
    """A factory: start Redis, a gateway and N workers (of `model`, SmolLM2 by default) with extra env settings;
    everything stops afterwards."""

    def start(workers: int, model: str = MODEL, worker_ids: list[str] | None = None, **settings: str) -> LocalCluster:
        # the default float16 KV pool: the fault tests compare a resumed stream with an undisturbed run token for
        # token, which the engine's batch-invariant numerics make exact (a re-prefill computes the decode's bits)
        return process_cluster(workers, model, worker_ids, **settings)

    return start
