"""The node's load deadline (LLMFLEET_POOL_LOAD_TIMEOUT_S) fails a slow on-demand load, but never kills a load of
`serve`'s eager (pinned) models: a first repack of a big file takes minutes, and a killed load only starts over.
A real redis-server; the worker is a stand-in process that never registers (it sleeps)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from redis import Redis

from llmfleet import warm_pool_redis
from llmfleet.child import PoolChild
from llmfleet.node import Node
from shared.settings import Settings
from shared.warm_pool import LOADING

pytestmark = [pytest.mark.integration]
TIMEOUT_S = 0.3


@pytest.fixture()
def sleeping_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker the node starts is `sleep 60`: alive, loading, never ready."""
    start = PoolChild.start

    def start_sleeper(self: PoolChild) -> None:
        self.argv = ["sleep", "60"]
        start(self)

    monkeypatch.setattr(PoolChild, "start", start_sleeper)


@pytest.fixture()
def node(redis_server, sleeping_workers, tmp_path) -> Iterator[Node]:  # noqa: ANN001
    """A node over one catalogued model (not loaded yet), with a load deadline of TIMEOUT_S; stopped after."""
    settings = replace(Settings(), redis_url=redis_server.url, pool_load_timeout_s=TIMEOUT_S)
    agent = Node(Redis.from_url(redis_server.url), settings, {"slow": str(tmp_path / "slow.gguf")},
                 env=dict(os.environ), max_loaded=0, memory_budget=1 << 40)
    yield agent
    agent.stop(grace_s=1)


def _ticks_past_deadline(node: Node) -> None:
    """Tick, wait past the deadline, tick again."""
    node.tick()
    time.sleep(TIMEOUT_S * 3)
    node.tick()


def test_a_pinned_load_is_never_killed_for_taking_long(node: Node) -> None:
    node.pinned["slow"] = 1
    _ticks_past_deadline(node)
    [worker] = node.workers
    assert worker.state == LOADING and worker.child.running
    assert warm_pool_redis.remembered_failure(node.redis, "slow") is None


def test_an_on_demand_load_past_the_deadline_fails_and_is_remembered(node: Node) -> None:
    node._launch("slow", pinned=False, evict=[])
    [worker] = node.workers
    _ticks_past_deadline(node)
    assert node.workers == [] and not worker.child.running
    failure = warm_pool_redis.remembered_failure(node.redis, "slow")
    assert failure is not None and f"not ready within {TIMEOUT_S:.0f}s" in failure
