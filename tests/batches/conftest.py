"""Fixtures of the batch tests: a real redis-server (the stores run Lua scripts) and clients of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only."""
    return "asyncio"


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
