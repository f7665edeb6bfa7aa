"""The gateway's main Redis pool over a real redis-server behind a proxy that stops forwarding on the connections
open at a moment (a partition that lost their packets; new connections flow): a command on such a connection fails
within the pool's socket timeout (shared/redis_sockets.py) instead of waiting until TCP gives up, and the gateway
answers a 503 with Retry-After, then serves again on fresh connections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.app import _redis_client, create_app
from shared.redis_sockets import COMMAND_TIMEOUT_S, CONNECT_TIMEOUT_S
from shared.settings import Settings
from tests.gateway.conftest import FakeWorker

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
SLACK_S = 1.5  # scheduling on a busy machine, and the pool's wait for a connection


def _settings(proxy_port: int) -> Settings:
    return Settings(redis_url=f"redis://127.0.0.1:{proxy_port}/0", registry_cache_s=0.0, request_timeout_s=10.0,
                    retry_after_s=2.0)


async def test_a_command_on_a_held_connection_fails_within_the_timeout_then_the_pool_dials_afresh(
        proxied_redis) -> None:
    _url, proxy = proxied_redis
    client = _redis_client(_settings(proxy.port))
    try:
        await client.set("k", b"v")
        proxy.hold_open()  # the pooled connection now forwards nothing, and nothing resets it
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            async with asyncio.timeout(COMMAND_TIMEOUT_S + CONNECT_TIMEOUT_S + SLACK_S):  # a hang fails here
                await client.get("k")
        assert time.monotonic() - started < COMMAND_TIMEOUT_S + SLACK_S
        assert await client.get("k") == b"v"  # the timed-out connection was closed: this one is new
    finally:
        await client.aclose()


@pytest.fixture()
async def gateway(proxied_redis) -> AsyncIterator[tuple[Any, httpx.AsyncClient, FakeWorker, Redis]]:
    """The gateway app with its own pool through the proxy, its health probe straight to Redis (a probe that
    redialled already), a scripted worker straight to Redis, and an HTTP client."""
    url, proxy = proxied_redis
    direct = Redis.from_url(url)
    worker = FakeWorker(direct)  # type: ignore[arg-type]
    await worker.register()
    app = create_app(_settings(proxy.port))
    async with app.router.lifespan_context(app):
        prober = SyncRedis.from_url(url, socket_timeout=1.0)
        app.state.broker.health._ping = prober.ping
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
            yield app, client, worker, direct
        prober.close()
    await direct.aclose()


async def _answered(client: httpx.AsyncClient, worker: FakeWorker) -> tuple[httpx.Response, float]:
    """POST a chat request; the scripted worker answers it if it gets queued. Returns the response and the
    seconds until it came (not counting the scripted worker's wind-down: a cancel that lands inside one of its
    redis-py calls can be lost, and then its take runs to its own deadline)."""
    async def answer() -> None:
        job = await worker.take(timeout=COMMAND_TIMEOUT_S + 5)
        await worker.answer(job, ["Hi"])

    answering = asyncio.create_task(answer())
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=CHAT)
    elapsed = time.monotonic() - started
    if response.status_code == 200:
        await answering
    else:
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)
    return response, elapsed


async def test_a_request_on_held_pool_connections_is_a_503_then_the_gateway_serves_again(
        gateway, proxied_redis) -> None:
    app, client, worker, _direct = gateway
    _url, proxy = proxied_redis
    assert (await _answered(client, worker))[0].status_code == 200  # the pool's connections are open now
    proxy.hold_open()
    response, elapsed = await _answered(client, worker)
    assert elapsed < COMMAND_TIMEOUT_S + SLACK_S  # not a hang until TCP gives up
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert response.json()["error"]["code"] == "unavailable"
    spent = 0.0  # each held connection costs a request at most once
    while (answered := await _answered(client, worker))[0].status_code != 200:
        response, elapsed = answered
        spent += elapsed
        assert response.status_code == 503, response.text
        assert spent < 4 * COMMAND_TIMEOUT_S, "the gateway did not serve again on fresh connections"
    response = answered[0]
    assert response.json()["choices"][0]["message"]["content"] == "Hi"
