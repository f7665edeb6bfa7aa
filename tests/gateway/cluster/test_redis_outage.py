"""Admission around a Redis outage: a fast 503 while Redis does not answer, and right after a Redis failure an
empty registry proves nothing (the request is queued with keep-alives, not refused with no_worker_available)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.cluster.redis_health import DOWN_AFTER_S, LOST_AFTER_S, PROBE_EVERY_S, RedisHealth
from shared import keys

pytestmark = pytest.mark.anyio
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class _Redis:
    """What the health probe PINGs: answers while `answering`, else fails as a paused Redis's PING times out."""

    def __init__(self) -> None:
        self.answering = True

    def ping(self) -> bool:
        if not self.answering:
            time.sleep(DOWN_AFTER_S)
            raise RedisTimeoutError("Timeout reading from socket")
        return True


async def _probed(broker) -> _Redis:
    """The broker's health probe on a scripted Redis; its pub/sub connection (to the real one) tells of answers
    only while the scripted one answers, as a paused Redis delivers nothing on it."""
    redis = _Redis()
    broker.health._ping = redis.ping
    broker.subscriber._on_answer = lambda: redis.answering and broker.health.note_answer()
    await broker.health.start()
    return redis


async def test_a_request_while_redis_does_not_answer_is_a_fast_503(app_client, worker) -> None:
    app, client = app_client
    redis = await _probed(app.state.broker)
    redis.answering = False
    await asyncio.sleep(DOWN_AFTER_S + 0.5)
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert time.monotonic() - started < 0.5
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert response.json()["error"]["code"] == "unavailable"


async def test_admission_waiting_on_redis_as_it_goes_down_is_a_503_within_a_second(app_client, worker) -> None:
    app, client = app_client
    broker = app.state.broker
    redis = await _probed(broker)

    async def paused() -> list:
        await asyncio.sleep(30)  # a SIGSTOPped Redis: connected, never answering
        return []

    app.state.registry.live_workers = paused
    redis.answering = False
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert time.monotonic() - started < 1.0 + PROBE_EVERY_S
    assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"
    assert broker.health.recently_failed(1.0)  # and the registry is unknown for the grace that follows
    assert broker._admitting.get("smollm2", 0) == 0


@pytest.mark.parametrize("known", [True, False], ids=["paused", "restarted-empty"])
async def test_right_after_a_redis_failure_an_empty_registry_queues(app_client, worker, redis, known) -> None:
    app, client = app_client
    await redis.delete(keys.worker_key(worker.worker_id), keys.WORKERS_INDEX)  # expired while Redis was away
    if not known:
        await redis.delete(keys.MODELS_INDEX)
    app.state.broker.health.note_error()
    call = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    await asyncio.sleep(0.6)  # queued, keep-alives going out: no 503
    assert not call.done()
    await worker.register()  # the worker's heartbeat, retried fast, lands
    job = await worker.take()
    await worker.answer(job, ["Hi"])
    response = await asyncio.wait_for(call, 5)
    assert response.status_code == 200
    assert response.text.startswith(": queued") and '"content":"Hi"' in response.text


async def test_long_after_a_failure_a_known_model_without_workers_is_503_again(app_client, redis) -> None:
    app, client = app_client
    app.state.broker.settings = dataclasses.replace(app.state.broker.settings, worker_wait_s=0)  # no wait for one
    await redis.zadd(keys.MODELS_INDEX, {"smollm2": time.time() - 60})
    app.state.broker.health._failed_at = time.monotonic() - app.state.broker.registry_grace_s() - 1
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_worker_available"


async def test_a_stream_whose_gateway_lost_redis_ends_with_a_503_not_at_its_deadline(app_client, worker) -> None:
    app, client = app_client
    broker = app.state.broker
    redis = await _probed(broker)
    call = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    job = await worker.take()
    await worker.token(job, "Hi")
    await asyncio.sleep(0.3)
    redis.answering = False  # cut off (a partition): no PING answered since LOST_AFTER_S ago
    broker.health._answered_at = time.monotonic() - LOST_AFTER_S - 0.1
    started = time.monotonic()
    response = await asyncio.wait_for(call, 5)
    assert time.monotonic() - started < 2.5  # within a check interval, not the request's 600 s deadline
    assert '"content":"Hi"' in response.text and '"code":"unavailable"' in response.text


def test_the_probe_notices_a_redis_that_stops_answering_and_comes_back() -> None:
    async def run() -> None:
        redis = _Redis()
        health = RedisHealth(redis.ping)
        await health.start()
        try:
            await asyncio.sleep(0.5)
            assert not health.down and not health.recently_failed(5)
            redis.answering = False
            await asyncio.wait_for(health.wait_down(), DOWN_AFTER_S * 2 + PROBE_EVERY_S + 0.5)
            assert health.down and health.recently_failed(5)
            redis.answering = True
            await asyncio.sleep(DOWN_AFTER_S + 2 * PROBE_EVERY_S + 0.2)
            assert not health.down and health.recently_failed(5)  # answering again; still in the grace
        finally:
            await health.close()

    asyncio.run(run())


def test_a_reply_seen_elsewhere_ends_down_at_once() -> None:
    async def run() -> None:
        redis, recovered = _Redis(), []
        health = RedisHealth(redis.ping, on_recovered=lambda: recovered.append(1))
        await health.start()
        try:
            redis.answering = False
            await asyncio.wait_for(health.wait_down(), DOWN_AFTER_S * 2 + PROBE_EVERY_S + 0.5)
            health.note_answer()  # e.g. /ready's PING went through before the probe's next one
            assert not health.down and recovered == [1]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(health.wait_down(), 0.05)
        finally:
            redis.answering = True
            await health.close()

    asyncio.run(run())
