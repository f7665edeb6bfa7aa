"""gateway.admin.lora_routes: POST /admin/loras answers 201 only once every live worker followed this very write, and
DELETE bumps the desired set's version too."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import httpx
import pytest

from shared import keys

pytestmark = pytest.mark.anyio
MODEL = "smollm2"  # the fake worker's model (conftest.py)


async def _version(redis: fakeredis.FakeAsyncRedis) -> int:
    return int(await redis.get(keys.loras_version(MODEL)) or 0)


async def test_a_worker_showing_the_adapter_from_before_the_write_is_not_counted(
        client: httpx.AsyncClient, redis: fakeredis.FakeAsyncRedis, worker: Any) -> None:
    await worker.register(loras="style", loras_version=0)  # still holds it from before a DELETE it has not followed
    post = asyncio.create_task(client.post("/admin/loras", json={"model": MODEL, "name": "style", "path": "/a.gguf"}))
    await asyncio.sleep(0.6)  # three polls
    assert not post.done()  # the stale entry is no evidence: the worker may drop the name at its next sync
    version = await _version(redis)
    assert version == 1
    await worker.register(loras="", loras_version=version)  # followed the write, but has not loaded it
    await asyncio.sleep(0.5)
    assert not post.done()
    await worker.register(loras="style", loras_version=version)
    reply = await asyncio.wait_for(post, 5)
    assert reply.status_code == 201 and reply.json()["loaded_by"] == [worker.worker_id]


async def test_delete_bumps_the_version(client: httpx.AsyncClient, redis: fakeredis.FakeAsyncRedis,
                                        worker: Any) -> None:
    await redis.hset(keys.loras_desired(MODEL), "style", '{"source": "/a.gguf"}')
    reply = await client.delete(f"/admin/loras/{MODEL}/style")
    assert reply.status_code == 200 and reply.json()["deleted"] is True
    assert await _version(redis) == 1 and not await redis.hexists(keys.loras_desired(MODEL), "style")
    missing = await client.delete(f"/admin/loras/{MODEL}/style")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "lora_not_found"
