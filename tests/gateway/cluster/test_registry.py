"""The gateway's cached registry: a read is reused for LLMFLEET_REGISTRY_CACHE_S, but where a model has no live
worker in it (admission) and for /ready, a read older than RECHECK_S is read again, so a worker that just
registered serves at once."""

from __future__ import annotations

import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.cluster.registry import RECHECK_S, Registry
from shared.errors import Unavailable
from shared.settings import Settings
from tests.gateway.conftest import MODEL, FakeWorker

pytestmark = pytest.mark.anyio


async def test_a_worker_that_just_registered_is_seen_within_the_recheck_not_the_cache(redis) -> None:
    now = [time.time()]
    registry = Registry(redis, Settings(registry_cache_s=5.0), clock=lambda: now[0])
    assert await registry.live_workers() == []
    await FakeWorker(redis).register()
    assert await registry.live_workers() == []  # the cached read, 0 s old
    assert await registry.live_workers(RECHECK_S) == []  # younger than RECHECK_S: still reused
    now[0] += 1.5 * RECHECK_S
    assert await registry.live_workers() == []  # the default: the cache's whole 5 s
    assert [w.model for w in await registry.live_workers(RECHECK_S)] == [MODEL]
    assert [w.model for w in await registry.live_workers()] == [MODEL]  # that read is the cached one now


async def test_a_recheck_is_never_older_than_the_configured_cache(redis) -> None:
    now = [time.time()]
    registry = Registry(redis, Settings(registry_cache_s=0.0), clock=lambda: now[0])
    assert await registry.live_workers(RECHECK_S) == []
    await FakeWorker(redis).register()
    assert [w.model for w in await registry.live_workers(RECHECK_S)] == [MODEL]


async def test_model_facts_while_redis_cannot_be_reached_is_a_503(redis, monkeypatch) -> None:
    registry = Registry(redis, Settings())

    async def refused(*_args: object) -> None:
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(redis, "hgetall", refused)
    with pytest.raises(Unavailable):  # the API's 503 with Retry-After, not a 500
        await registry.model_facts()
