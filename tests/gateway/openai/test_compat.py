"""The compatibility surface tools assume: routes without /v1, `model` optional with one model served, CORS."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import fakeredis
import httpx
import pytest

from gateway.app import create_app

pytestmark = pytest.mark.anyio
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_unprefixed_routes_answer_like_the_v1_ones(client: httpx.AsyncClient, worker: Any) -> None:
    task = asyncio.create_task(client.post("/chat/completions", json={"model": "smollm2", **CHAT}))
    await worker.answer(await worker.take(), ["ok"])
    assert (await task).json()["choices"][0]["message"]["content"] == "ok"
    assert [m["id"] for m in (await client.get("/models")).json()["data"]] == ["smollm2"]
    assert (await client.get("/models/smollm2")).json()["id"] == "smollm2"


async def test_model_may_be_left_out_when_one_model_is_served(client: httpx.AsyncClient, worker: Any) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    assert job.model == "smollm2"
    await worker.answer(job, ["ok"])
    assert (await task).json()["model"] == "smollm2"


async def test_a_null_model_is_a_left_out_one(client: httpx.AsyncClient, worker: Any) -> None:
    task = asyncio.create_task(client.post("/chat/completions", json={"model": None, **CHAT}))  # llama.cpp's tests
    job = await worker.take()
    assert job.model == "smollm2"
    await worker.answer(job, ["ok"])
    assert (await task).json()["choices"][0]["message"]["content"] == "ok"


async def test_model_is_required_when_several_or_none_are_served(client: httpx.AsyncClient,
                                                                 make_worker: Any) -> None:
    none = await client.post("/v1/chat/completions", json=CHAT)
    assert none.status_code == 400 and none.json()["error"]["param"] == "model"
    await make_worker(worker_id="a").register()
    await make_worker(worker_id="b", model="gemma3-270m").register()
    several = await client.post("/v1/completions", json={"prompt": "x", "model": None})
    error = several.json()["error"]
    assert several.status_code == 400 and error["param"] == "model"
    assert "2 models are served: gemma3-270m, smollm2" in error["message"]


@pytest.fixture
async def any_name_client(settings: Any, server: Any) -> Any:
    """A gateway with LLMFLEET_ANY_MODEL_NAME=1."""
    app = create_app(dataclasses.replace(settings, any_model_name=1), redis=fakeredis.FakeAsyncRedis(server=server))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c


async def test_any_model_name_is_an_unknown_name_served_by_the_one_model(client: httpx.AsyncClient,
                                                                        any_name_client: httpx.AsyncClient,
                                                                        make_worker: Any) -> None:
    await make_worker(worker_id="a").register()
    strict = await client.post("/v1/chat/completions", json={"model": "gpt-3.5-turbo", **CHAT})
    assert strict.status_code == 404 and strict.json()["error"]["code"] == "model_not_found"  # the default
    task = asyncio.create_task(any_name_client.post("/v1/chat/completions", json={"model": "gpt-3.5-turbo", **CHAT}))
    worker = make_worker(worker_id="a")
    job = await worker.take()
    assert job.model == "smollm2"
    await worker.answer(job, ["ok"])
    assert (await task).json()["model"] == "smollm2"
    await make_worker(worker_id="b", model="gemma3-270m").register()
    await asyncio.sleep(0.01)
    several = await any_name_client.post("/v1/completions", json={"model": "gpt-3.5-turbo", "prompt": "x"})
    assert several.status_code == 404  # with two models served, a name must be one of them


@pytest.fixture
async def cors_client(settings: Any, server: Any) -> Any:
    """A gateway with an API key and one allowed browser origin."""
    configured = dataclasses.replace(settings, api_key="secret", cors_origins="https://app.example")
    app = create_app(configured, redis=fakeredis.FakeAsyncRedis(server=server))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c


async def test_cors_preflight_needs_no_key_and_names_the_origin(cors_client: httpx.AsyncClient) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    response = await cors_client.options("/v1/chat/completions", headers=preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://app.example"
    denied = await cors_client.options("/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in denied.headers
    unauthorised = await cors_client.get("/v1/models", headers={"Origin": "https://app.example"})
    assert unauthorised.status_code == 401  # CORS answers the browser; the key still guards the API
    assert unauthorised.headers["access-control-allow-origin"] == "https://app.example"
