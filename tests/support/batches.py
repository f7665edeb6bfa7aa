"""What the batch tests share: clients of a real Redis (the stores run Lua scripts) and a `llmfleet
batch-runner` process on a running cluster."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio import Redis

from llmfleet.local_cluster import LocalCluster, cli


@pytest.fixture
async def aredis(redis_server: Any) -> AsyncIterator[Redis]:
    """An async client of a fresh real Redis."""
    client = Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def sredis(redis_server: Any) -> Iterator[redis.Redis]:
    """A synchronous client of the same Redis (what rq uses)."""
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def start_batch_runner(cluster: LocalCluster, log: Path | None = None, **settings: str) -> subprocess.Popen[bytes]:
    """A `llmfleet batch-runner` process of the cluster with extra settings, logging to `log` (default: the
    cluster's batch-runner.log)."""
    return cluster.spawn("batch-runner", cli("batch-runner"), env=settings, log=log)
