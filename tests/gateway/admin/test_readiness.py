"""/ready tells the truth (FakeRedis; the real `serve` is in tests/llmfleet/test_serve_ready.py): it waits for a live
worker of every model the deployment was started with and names the ones that cannot take a request yet;
/ready/gateway is this gateway alone; a request without `model` means the one model the deployment serves."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import httpx
import pytest

from gateway.app import create_app
from shared import keys
from shared.settings import Settings
from shared.warm_pool import LOADING, ModelSlot, NodeState
from tests.gateway.conftest import MODEL

pytestmark = pytest.mark.anyio


async def _node(redis: fakeredis.FakeAsyncRedis, *, pinned: tuple[str, ...], loading: tuple[str, ...] = ()) -> None:
    state = NodeState(node_id="n1", heartbeat=time.time(), max_loaded=2, memory_budget=2**30,
                      catalogue={MODEL: "smollm2-135m", "cold": "/models/cold.gguf"}, pinned=pinned,
                      models={m: ModelSlot(state=LOADING, pinned=True) for m in loading})
    await redis.hset(keys.node_key("n1"), mapping=state.to_hash())
    await redis.zadd(keys.NODES_INDEX, {"n1": state.heartbeat})


async def test_a_pinned_model_still_loading_is_named_until_its_worker_registers(client: httpx.AsyncClient, redis,
                                                                                make_worker) -> None:
    await _node(redis, pinned=(MODEL,), loading=(MODEL,))
    response = await client.get("/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False and body["models"] == {MODEL: "loading"}
    assert body["waiting_for"] == [f"{MODEL} (loading)"] and body["nodes"] == 1
    assert (await client.get("/ready/gateway")).status_code == 200  # this gateway takes (and queues) requests
    await make_worker().register()
    response = await client.get("/ready")
    assert response.status_code == 200 and response.json()["models"] == {MODEL: "ready"}
    assert "waiting_for" not in response.json()


async def test_a_lazy_pool_is_ready_while_its_models_load_on_demand(client: httpx.AsyncClient, redis) -> None:
    await _node(redis, pinned=())
    response = await client.get("/ready")
    assert response.status_code == 200 and response.json()["nodes"] == 1 and "models" not in response.json()


async def test_a_remembered_load_failure_is_named(client: httpx.AsyncClient, redis) -> None:
    await _node(redis, pinned=(MODEL,))
    await redis.set(keys.pool_failed(MODEL), b"model could not be loaded: not a GGUF file", ex=30)
    body = (await client.get("/ready")).json()
    assert body["models"] == {MODEL: "failed"} and body["waiting_for"] == [f"{MODEL} (failed)"]
    assert body["degraded"] is True  # a required model failed to load (a read-only cache, a broken file)
    await redis.delete(keys.pool_failed(MODEL))
    assert "degraded" not in (await client.get("/ready")).json()  # loading again: not a failure


async def test_under_serve_a_failed_required_model_is_degraded_though_every_worker_runs(app_client, redis) -> None:
    """`serve`'s supervisor counts the workers it runs; the node dropped the one whose load failed, so the counts
    agree: the failure is what makes the deployment degraded."""
    app, client = app_client
    await _node(redis, pinned=(MODEL,))
    app.state.broker.settings = dataclasses.replace(app.state.broker.settings,
                                                    supervisor_key="llmfleet:supervisor:test")
    await redis.hset("llmfleet:supervisor:test", mapping={"workers_expected": 0, "workers_running": 0,
                                                          "workers_given_up": "", "restarts": 0})
    assert (await client.get("/ready")).json()["degraded"] is False
    await redis.set(keys.pool_failed(MODEL), b"model could not be loaded: EROFS", ex=30)
    body = (await client.get("/ready")).json()
    assert body["degraded"] is True and body["supervisor"]["workers_given_up"] == []


@pytest.fixture
async def required_client(settings: Settings, server: fakeredis.FakeServer) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway told (LLMFLEET_REQUIRED_MODELS) that the deployment serves MODEL and gemma."""
    app = create_app(dataclasses.replace(settings, required_models=f"{MODEL}, gemma"),
                     redis=fakeredis.FakeAsyncRedis(server=server))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://g") as http:
        yield http


async def test_required_models_from_the_setting(required_client: httpx.AsyncClient, worker) -> None:
    response = await required_client.get("/ready")
    assert response.status_code == 503
    assert response.json()["models"] == {MODEL: "ready", "gemma": "no worker"}
    assert response.json()["waiting_for"] == ["gemma (no worker)"]


async def test_no_worker_and_no_node_is_not_ready(client: httpx.AsyncClient) -> None:
    response = await client.get("/ready")
    assert response.status_code == 503 and response.json()["waiting_for"] == ["a worker (none is registered)"]


async def test_redis_away_is_not_ready_anywhere(client: httpx.AsyncClient, server: fakeredis.FakeServer) -> None:
    server.connected = False
    for path in ("/ready", "/ready/gateway"):
        response = await client.get(path)
        assert response.status_code == 503 and response.json()["redis"] is False
    assert (await client.get("/health")).status_code == 200


async def test_a_request_without_model_means_the_model_still_loading(client: httpx.AsyncClient, redis,
                                                                    make_worker) -> None:
    await _node(redis, pinned=(MODEL,), loading=(MODEL,))
    request: Any = asyncio.create_task(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
    late = make_worker()
    job = await late.take()  # queued while no worker is registered: the pinned model was meant
    assert job.model == MODEL
    await late.register()
    await late.answer(job, ["Hello"])
    response = await request
    assert response.status_code == 200 and response.json()["model"] == MODEL
