"""Scale to zero: a request for a known model with no live worker is queued and waits LLMFLEET_WORKER_WAIT_S for one
(streams get `: queued` and keep-alives meanwhile, the queue metric counts the job), then ends with a 503
no_worker_available and its job cancelled; LLMFLEET_WORKER_WAIT_S=0 keeps the 503 at once."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from shared import codec, keys
from shared.settings import Settings
from tests.gateway.conftest import FakeWorker

pytestmark = pytest.mark.anyio
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The gateway tests' settings with keep-alives every 0.2 s."""
    return dataclasses.replace(settings, sse_keepalive_s=0.2)


def _wait(app, seconds: float) -> None:
    """Set the gateway's LLMFLEET_WORKER_WAIT_S (the broker is what reads it)."""
    app.state.broker.settings = dataclasses.replace(app.state.broker.settings, worker_wait_s=seconds)


async def test_a_request_with_no_live_worker_waits_for_one_with_keep_alives(app_client, redis) -> None:
    app, client = app_client
    _wait(app, 5.0)
    await redis.zadd(keys.MODELS_INDEX, {"smollm2": time.time() - 60})  # served a minute ago: scaled to zero
    call = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    await asyncio.sleep(1.2)
    assert not call.done()  # queued, not refused
    metrics = (await client.get("/metrics")).text
    assert 'llmfleet_model_jobs{model="smollm2"} 1.0' in metrics  # what KEDA starts the first worker for
    worker = FakeWorker(redis)  # a worker comes up
    await worker.register()
    job = await worker.take()
    await worker.answer(job, ["Hi"])
    response = await asyncio.wait_for(call, 5)
    assert response.status_code == 200
    assert response.text.startswith(": queued") and response.text.count(": keep-alive") >= 3
    assert '"content":"Hi"' in response.text


async def test_with_no_worker_by_the_end_of_the_wait_the_request_is_a_503_and_its_job_cancelled(app_client,
                                                                                                 redis) -> None:
    app, client = app_client
    _wait(app, 0.5)
    await redis.zadd(keys.MODELS_INDEX, {"smollm2": time.time() - 60})
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=CHAT)
    waited = time.monotonic() - started
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    error = response.json()["error"]
    assert error["code"] == "no_worker_available" and "LLMFLEET_WORKER_WAIT_S" in error["message"]
    assert 0.5 <= waited < 3
    [(_stream, [(_entry, fields)])] = await redis.xread({keys.jobs_stream("smollm2"): "0"})
    job = codec.decode_job(fields[keys.JOB_FIELD.encode()])
    assert await redis.exists(keys.cancelled_marker(job.model, job.id))  # a worker that starts later drops it


async def test_a_worker_that_registered_but_is_busy_leaves_the_job_to_the_queue(app_client, redis) -> None:
    """The wait is over but a worker is live now (its queue holds the job): no 503; the deadline rules."""
    app, client = app_client
    _wait(app, 0.3)
    await redis.zadd(keys.MODELS_INDEX, {"smollm2": time.time() - 60})
    call = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    worker = FakeWorker(redis)
    await worker.register()
    await asyncio.sleep(1.5)  # past the wait, the worker has not taken the job yet
    assert not call.done()
    job = await worker.take()
    await worker.answer(job, ["Hi"])
    response = await asyncio.wait_for(call, 5)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "Hi"


async def test_a_wait_of_zero_is_the_503_at_once(app_client, redis) -> None:
    app, client = app_client
    _wait(app, 0.0)
    await redis.zadd(keys.MODELS_INDEX, {"smollm2": time.time() - 60})
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_worker_available"
    assert await redis.xlen(keys.jobs_stream("smollm2")) == 0
