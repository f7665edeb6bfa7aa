"""The dashboard's page, assets and fleet.json: what a worker's registry entry becomes, queue depths, the
fleet's recent errors (recorded without any request content), and the API-key rule."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import fakeredis
import httpx
import pytest

from gateway.admin.dashboard import ASSETS
from gateway.app import create_app
from shared import keys
from shared.errors import ContextLengthExceeded, InternalError
from shared.settings import Settings

pytestmark = pytest.mark.anyio

SECRET_PROMPT = "the secret launch code is 4242"
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": SECRET_PROMPT}]}


async def fleet(app: Any, client: httpx.AsyncClient, **headers: str) -> dict[str, Any]:
    """GET /dashboard/fleet.json once the error entries under way are written."""
    await app.state.broker.errors.flush()
    response = await client.get("/dashboard/fleet.json", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    return response.json()


async def test_the_page_and_its_assets_are_served_with_a_same_origin_policy(client: httpx.AsyncClient) -> None:
    page = await client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    for name in re.findall(r'(?:src|href)="dashboard/([^"]+)"', page.text):
        asset = await client.get(f"/dashboard/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"] == ASSETS[name], name
    assert sorted(re.findall(r'(?:src|href)="dashboard/([^"]+)"', page.text)) == sorted(ASSETS)
    missing = await client.get("/dashboard/app.py")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"
    slash = await client.get("/dashboard/", follow_redirects=False)
    assert slash.status_code in (301, 302, 307, 308) and slash.headers["location"].endswith("/dashboard")


def test_the_static_files_name_no_external_url_and_hold_no_inline_script() -> None:
    static = resources.files("gateway") / "static"
    for name in ("index.html", *ASSETS):
        text = (static / name).read_text(encoding="utf-8")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), name
        assert "innerHTML" not in text and "eval(" not in text, name
    html = (static / "index.html").read_text(encoding="utf-8")
    assert re.findall(r"<script[^>]*>(.*?)</script>", html, re.DOTALL) == [""]  # one script, from a file
    assert " style=" not in html  # the CSP allows no inline style either


async def test_fleet_json_shows_every_reporting_worker_and_each_known_models_queue(
        app_client: tuple[Any, httpx.AsyncClient], make_worker: Any, redis: fakeredis.FakeAsyncRedis) -> None:
    app, client = app_client
    busy, leaving = make_worker(worker_id="w-busy"), make_worker(worker_id="w-leaving", model="gemma3-270m")
    await busy.register(**{"stat.active": 3, "stat.queue_depth": 1, "stat.kv_blocks_used": 25,
                           "stat.kv_blocks_total": 100, "stat.generated_tokens": 512, "stat.prompt_tokens": 64,
                           "stat.unknown_future_stat": 7})
    await leaving.register(state="draining")
    await redis.zadd(keys.MODELS_INDEX, {"qwen2-old": 1e12})  # known (a worker served it), no worker now
    for _ in range(2):  # queued jobs no worker has taken yet
        await redis.xadd(keys.jobs_stream("smollm2"), {keys.JOB_FIELD: b"x"})
    body = await fleet(app, client)
    workers = {w["id"]: w for w in body["workers"]}
    assert set(workers) == {"w-busy", "w-leaving"}
    w = workers["w-busy"]
    assert (w["model"], w["state"], w["slots"], w["running"], w["waiting"]) == ("smollm2", "ready", 8, 3, 1)
    assert (w["kv_blocks_used"], w["kv_blocks_total"], w["kv_usage"]) == (25, 100, 0.25)
    assert w["stats"] == {"generated_tokens": 512, "prompt_tokens": 64}
    assert w["host"] and 0 <= w["heartbeat_age_s"] < 5 and w["heartbeat"] == pytest.approx(body["time"], abs=5)
    assert workers["w-leaving"]["state"] == "draining" and workers["w-leaving"]["kv_usage"] is None
    queues = {m["model"]: m for m in body["models"]}
    assert queues["smollm2"] == {"model": "smollm2", "waiting": 2, "workers": 1, "running": 3}
    assert queues["gemma3-270m"]["workers"] == 0  # draining: it takes nothing new
    assert queues["qwen2-old"] == {"model": "qwen2-old", "waiting": 0, "workers": 0, "running": 0}
    assert body["errors"] == [] and body["gateway"]["requests_in_flight"] == 0


async def test_errors_are_listed_newest_first_with_ids_but_never_content(
        app_client: tuple[Any, httpx.AsyncClient], worker: Any) -> None:
    app, client = app_client
    assert (await client.post("/v1/chat/completions", content=b"{not json")).status_code == 400
    assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})).status_code == 404
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    await worker.send(ContextLengthExceeded(f"too long: {SECRET_PROMPT}", param="messages")
                      .to_event(job.id, worker.next_seq(job.id)))
    assert (await task).status_code == 400
    task = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    streamed = await worker.take()
    await worker.token(streamed, "Hel")
    await worker.send(InternalError("the worker crashed").to_event(streamed.id, worker.next_seq(streamed.id)))
    assert (await task).status_code == 200
    body = await fleet(app, client)
    assert SECRET_PROMPT not in json.dumps(body) and "crashed" not in json.dumps(body)
    errors = body["errors"]
    assert [(e["status"], e["code"], e["model"], e["streamed"]) for e in errors] == [
        (500, None, "smollm2", True),
        (400, "context_length_exceeded", "smollm2", False),
        (404, "model_not_found", "nope", False),
        (400, None, None, False),
    ]
    assert errors[0]["request_id"] == streamed.id and errors[1]["request_id"] == job.id
    assert errors[1]["param"] == "messages" and errors[1]["path"] == "/v1/chat/completions"
    assert errors[2]["request_id"] is None and errors[3]["request_id"] is None  # never queued: no id to look for
    assert errors[0]["time"] >= errors[1]["time"] >= errors[3]["time"] > 0
    assert set(errors[0]) == {"time", "model", "status", "type", "code", "param", "request_id", "key", "path",
                              "streamed"}


@pytest.fixture
async def keyed(settings: Settings, server: fakeredis.FakeServer) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """A gateway that requires the key 'sk-dash'."""
    redis = fakeredis.FakeAsyncRedis(server=server)
    app = create_app(dataclasses.replace(settings, api_key="sk-dash"), redis=redis)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield app, client
    await redis.aclose()


async def test_the_page_is_public_and_its_data_follows_the_key_rule(keyed: tuple[Any, httpx.AsyncClient],
                                                                     worker: Any) -> None:
    app, client = keyed
    for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css"):
        assert (await client.get(path)).status_code == 200, path
    refused = await client.get("/dashboard/fleet.json")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert (await client.get("/v1/models", headers={"Authorization": "Bearer wrong"})).status_code == 401
    body = await fleet(app, client, Authorization="Bearer sk-dash")
    assert [w["id"] for w in body["workers"]] == ["w1"]
    # the dashboard's own wait for a key is not listed; the API request with a wrong key is
    assert [(e["status"], e["code"], e["path"]) for e in body["errors"]] == [(401, "invalid_api_key", "/v1/models")]
    assert (await client.get("/dashboard/fleet.json", headers={"X-Api-Key": "sk-dash"})).status_code == 200


async def test_fleet_json_is_a_503_when_redis_is_away(app_client: tuple[Any, httpx.AsyncClient],
                                                      server: fakeredis.FakeServer) -> None:
    _app, client = app_client
    server.connected = False
    response = await client.get("/dashboard/fleet.json")
    server.connected = True
    assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"
    assert "retry-after" in response.headers
