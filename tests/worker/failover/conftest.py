"""Fixtures for the failover tests: a real Redis holding model m's job stream and its consumer group."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shared import keys

JOBS_STREAM = keys.jobs_stream("m")  # the stream every failover test reads and claims from


@pytest.fixture()
def client(redis_server: Any) -> redis.Redis:
    """A client of a fresh redis-server with JOBS_STREAM and its jobs group created."""
    client = redis.Redis.from_url(redis_server.url)
    client.xgroup_create(JOBS_STREAM, keys.JOBS_GROUP, id="0", mkstream=True)
    return client
