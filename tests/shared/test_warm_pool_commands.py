"""The warm pool's wire has one owner (shared/warm_pool_commands.py) that the gateway (asyncio) and the node
agent (sync) both run: what one side writes the other reads, and a load command forgets a remembered load
failure whichever side sends it (the node side's add_command once did not)."""

from __future__ import annotations

import fakeredis
import pytest

from gateway.cluster.registry import Registry
from gateway.cluster.warm_pool import WarmPool
from llmfleet import warm_pool_redis
from shared import keys
from shared import warm_pool_commands as pool_wire
from shared.redis_commands import run, run_async
from shared.settings import Settings
from shared.warm_pool import READY, ModelSlot, NodeState

NOW = 1_000.0
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """Run these async tests on asyncio only (the gateway's loop)."""
    return "asyncio"


@pytest.fixture
def clients() -> tuple[fakeredis.FakeRedis, fakeredis.FakeAsyncRedis]:
    """A sync and an asyncio client of one fake server (the node agent's and the gateway's)."""
    server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=server), fakeredis.FakeAsyncRedis(server=server)


def _pool(redis: fakeredis.FakeAsyncRedis) -> WarmPool:
    settings = Settings()
    return WarmPool(redis, settings, Registry(redis, settings, clock=lambda: NOW), clock=lambda: NOW)


async def test_a_load_from_either_side_forgets_the_remembered_failure(clients) -> None:
    sync, asynchronous = clients
    for send in (lambda: warm_pool_redis.add_command(sync, "load", "m"), lambda: _pool(asynchronous).command("load", "m")):
        warm_pool_redis.record_failure(sync, "m", "model 'm' could not be loaded: bad file", 30)
        assert await _pool(asynchronous).remembered_failure("m") == "model 'm' could not be loaded: bad file"
        result = send()
        if result is not None:
            await result
        assert warm_pool_redis.remembered_failure(sync, "m") is None
        assert await _pool(asynchronous).remembered_failure("m") is None
    commands, _after = warm_pool_redis.read_commands(sync, b"0-0")
    assert commands == [{"op": "load", "model": "m", "force": "0"}] * 2


async def test_an_unload_leaves_the_failure_and_the_gateway_reads_its_time_left(clients) -> None:
    sync, asynchronous = clients
    warm_pool_redis.record_failure(sync, "m", "broken", 30)
    warm_pool_redis.add_command(sync, "unload", "m", force=True)
    message, ttl_s = await run_async(asynchronous, pool_wire.failure_with_ttl("m"))
    assert message == "broken" and 29 <= ttl_s <= 30
    assert await run_async(asynchronous, pool_wire.failure_with_ttl("other")) is None


async def test_the_gateways_use_marks_are_what_the_node_reads(clients) -> None:
    sync, asynchronous = clients
    pool = _pool(asynchronous)
    await pool.note_use("a", keep_alive=300.0)
    await pool.note_use("b", keep_alive=-1.0)
    await asynchronous.hset(keys.POOL_KEEP_ALIVE, "c", "not a number")
    used, keep_alive = warm_pool_redis.usage(sync)
    assert used == {"a": NOW, "b": NOW} and keep_alive == {"a": 300.0, "b": -1.0}
    assert await pool.keep_alives() == keep_alive == run(sync, pool_wire.keep_alives())


async def test_a_nodes_published_state_is_what_the_gateway_reads_until_it_is_removed(clients) -> None:
    sync, asynchronous = clients
    state = NodeState(node_id="n1", heartbeat=NOW, max_loaded=1, memory_budget=1 << 30, catalogue={"a": "a.gguf"},
                      models={"a": ModelSlot(state=READY, replicas=1, memory=5, last_used=3.0)})
    warm_pool_redis.publish_state(sync, state)
    assert await _pool(asynchronous).nodes() == [state] == run(sync, pool_wire.live_nodes(NOW))
    assert await run_async(asynchronous, pool_wire.live_nodes(NOW + 60)) == []  # stale: not live
    warm_pool_redis.remove_state(sync, "n1")
    assert await run_async(asynchronous, pool_wire.live_nodes(NOW)) == []
