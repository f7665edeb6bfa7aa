"""The gateway's side of the warm pool (FakeRedis; the real processes are in tests/llmfleet/test_node.py):
catalogued models are listed and admitted while no worker serves them, a remembered failure is a 503,
keep_alive and last use are marked, and the admin API is behind the key and refuses a busy unload."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import httpx
import pytest
from redis.asyncio import BlockingConnectionPool

from gateway.app import create_app
from shared import keys
from shared.settings import Settings
from shared.warm_pool import LOADING, ModelSlot, NodeState

pytestmark = pytest.mark.anyio


async def _node(redis: fakeredis.FakeAsyncRedis, models: dict[str, ModelSlot] | None = None) -> None:
    state = NodeState(node_id="n1", heartbeat=time.time(), max_loaded=1, memory_budget=2**30,
                      catalogue={"cold": "/models/cold.gguf", "smollm2": "smollm2-135m"}, models=models or {})
    await redis.hset(keys.node_key("n1"), mapping=state.to_hash())
    await redis.zadd(keys.NODES_INDEX, {"n1": state.heartbeat})


async def test_models_lists_the_catalogue_with_whether_it_is_loaded(client: httpx.AsyncClient, redis, worker) -> None:
    await _node(redis)
    data = (await client.get("/v1/models")).json()["data"]
    assert {m["id"]: m["loaded"] for m in data} == {"cold": False, "smollm2": True}
    assert (await client.get("/v1/models/cold")).json()["loaded"] is False
    ready = (await client.get("/ready")).json()
    assert ready["nodes"] == 1


async def test_a_cold_catalogued_model_is_queued_and_served_once_a_worker_comes(client: httpx.AsyncClient, redis,
                                                                               make_worker) -> None:
    await _node(redis)
    body = {"model": "cold", "prompt": "hi", "max_tokens": 2, "keep_alive": "10m"}
    request = asyncio.create_task(client.post("/v1/completions", json=body))
    late = make_worker(model="cold", worker_id="w-cold")
    await late.register()  # the node's worker registers, then takes the queued job
    job = await late.take()
    await late.answer(job, ["Hello"])
    response = await request
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "Hello"
    assert float(await redis.hget(keys.POOL_KEEP_ALIVE, "cold")) == 600.0
    assert await redis.zscore(keys.POOL_USED, "cold") > time.time() - 60


async def test_a_remembered_load_failure_is_a_503_at_once(client: httpx.AsyncClient, redis) -> None:
    await _node(redis)
    await redis.set(keys.pool_failed("cold"), b"model 'cold' could not be loaded: not a GGUF file", ex=30)
    response = await client.post("/v1/completions", json={"model": "cold", "prompt": "hi"})
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "model_load_failed" and "not a GGUF file" in error["message"]
    status = (await client.get("/admin/models")).json()["data"]
    assert {m["id"]: m["status"] for m in status}["cold"] == "failed"
    bad = await client.post("/v1/completions", json={"model": "cold", "prompt": "hi", "keep_alive": [1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"


async def test_admin_models_and_a_busy_unload(client: httpx.AsyncClient, redis, make_worker) -> None:
    await _node(redis, {"cold": ModelSlot(state=LOADING, memory=123)})
    busy = make_worker(model="smollm2", worker_id="w-busy")
    await busy.register(load=2)
    data = {m["id"]: m for m in (await client.get("/admin/models")).json()["data"]}
    assert data["cold"]["status"] == "loading" and data["cold"]["memory_bytes"] == 123
    assert data["smollm2"]["status"] == "ready" and data["smollm2"]["in_flight"] == 2
    refused = await client.post("/admin/models/unload", json={"model": "smollm2"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_busy"
    missing = await client.post("/admin/models/load", json={"model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    asked = await client.post("/admin/models/load", json={"model": "cold", "wait": False})
    assert asked.status_code == 202 and asked.json()["status"] == "loading"
    [(_, fields)] = await redis.xrange(keys.POOL_COMMANDS)
    assert fields == {b"op": b"load", b"model": b"cold", b"force": b"0"}


@pytest.fixture
async def keyed_client(settings: Settings, server: fakeredis.FakeServer) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway that needs the API key `sk-test`."""
    gateway_redis = fakeredis.FakeAsyncRedis(server=server, connection_pool_class=BlockingConnectionPool,
                                             max_connections=settings.redis_max_connections)
    app: Any = create_app(dataclasses.replace(settings, api_key="sk-test"), redis=gateway_redis)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client
    await gateway_redis.aclose()


async def test_the_admin_api_needs_the_key(keyed_client: httpx.AsyncClient) -> None:
    assert (await keyed_client.get("/admin/models")).status_code == 401
    assert (await keyed_client.post("/admin/models/unload", json={"model": "x"})).status_code == 401
    allowed = await keyed_client.get("/admin/models", headers={"Authorization": "Bearer sk-test"})
    assert allowed.status_code == 200 and allowed.json()["object"] == "list"


KEEP_ALIVE_BODIES = {  # every API surface passes its body's keep_alive to the warm pool (read by its protocol)
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi", "store": False},
    "/api/chat": {"messages": [{"role": "user", "content": "hi"}], "stream": False},
}


@pytest.mark.parametrize("path", sorted(KEEP_ALIVE_BODIES))
async def test_each_api_passes_its_keep_alive_to_the_warm_pool(client: httpx.AsyncClient, redis, worker,
                                                               path: str) -> None:
    await _node(redis)
    body = {"model": "smollm2", "keep_alive": "7m", **KEEP_ALIVE_BODIES[path]}
    request = asyncio.create_task(client.post(path, json=body))
    await worker.answer(await worker.take(), ["Hello"])
    assert (await request).status_code == 200
    assert float(await redis.hget(keys.POOL_KEEP_ALIVE, "smollm2")) == 420.0
