"""How a batch run ends when it cannot run its lines (no worker needed): lease held elsewhere, cancelled
before it started, input file gone, runners dead too often, completion window over."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from batches.files import FileStore
from batches.redis_clients import async_client
from batches.runner import BatchRun
from batches.store import BatchStore
from shared import keys
from shared.redis_sockets import COMMAND_TIMEOUT_S
from shared.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

LINES = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "x"}}
         for i in range(3)]


@pytest.fixture
def settings(redis_server: Any) -> Settings:
    return Settings(redis_url=redis_server.url, batch_lease_s=0.3, max_deliveries=2, heartbeat_interval_s=0.1,
                    retry_after_s=0.1)


async def make(aredis: Redis, lines: list[dict[str, Any]] = LINES) -> tuple[BatchStore, FileStore, str]:
    store, files = BatchStore(aredis), FileStore(aredis)
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    input_file = await files.create("in.jsonl", "batch", data)
    batch = await store.create(input_file_id=input_file["id"], endpoint="/v1/completions", completion_window="24h",
                               metadata=None, total=len(lines))
    return store, files, batch["id"]


async def test_a_batch_leased_by_another_runner_is_left_alone(aredis: Redis, settings: Settings) -> None:
    store, _, batch_id = await make(aredis)
    await aredis.set(keys.batch_lease(batch_id), "someone-else", px=5000)
    assert await BatchRun(batch_id, settings).run() == "held"
    assert (await store.get(batch_id))["status"] == "validating"


async def test_cancelled_before_it_started(aredis: Redis, settings: Settings) -> None:
    store, _, batch_id = await make(aredis)
    await store.cancel(batch_id)
    assert await BatchRun(batch_id, settings).run() == "cancelled"
    batch = await store.get(batch_id)
    assert batch["status"] == "cancelled" and batch["output_file_id"] is None
    assert not await aredis.exists(keys.batch_lease(batch_id))  # released


async def test_input_file_deleted_fails_the_batch_with_a_reason(aredis: Redis, settings: Settings) -> None:
    store, files, batch_id = await make(aredis)
    await files.delete((await store.get(batch_id))["input_file_id"])
    assert await BatchRun(batch_id, settings).run() == "failed"
    batch = await store.get(batch_id)
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    assert batch["errors"]["data"][0]["code"] == "invalid_input_file"
    assert not await aredis.sismember(keys.BATCHES_ACTIVE, batch_id)


async def test_runners_dying_too_often_fail_the_batch_keeping_what_finished(aredis: Redis, settings: Settings) -> None:
    store, files, batch_id = await make(aredis)
    await store.transition(batch_id, "in_progress", allowed_from=("validating",))
    await store.record(batch_id, 1, True, json.dumps({"custom_id": "c1"}))
    await store.set_field(batch_id, "attempts", "3")
    assert await BatchRun(batch_id, settings).run() == "failed"
    batch = await store.get(batch_id)
    assert batch["status"] == "failed" and batch["errors"]["data"][0]["code"] == "batch_runner_died"
    assert json.loads(await files.content(batch["output_file_id"]))["custom_id"] == "c1"


async def test_lines_not_run_by_the_end_of_the_window_expire(aredis: Redis, settings: Settings) -> None:
    store, files, batch_id = await make(aredis)  # no worker: every line waits (503, retried) until expiry
    await store.set_field(batch_id, "expires_at", repr(time.time() + 0.5))
    started = time.monotonic()
    assert await BatchRun(batch_id, settings).run() == "expired"
    assert time.monotonic() - started < 5
    batch = await store.get(batch_id)
    assert batch["status"] == "expired" and batch["expired_at"] is not None
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    errors = [json.loads(line) for line in (await files.content(batch["error_file_id"])).decode().splitlines()]
    assert [e["custom_id"] for e in errors] == ["c0", "c1", "c2"]
    assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors)


async def test_a_runs_command_on_a_held_connection_fails_within_the_timeout(proxied_redis: Any) -> None:
    _url, proxy = proxied_redis
    client = async_client(f"redis://127.0.0.1:{proxy.port}/0")
    try:
        await client.set("k", b"v")
        proxy.hold_open()  # a partition that lost the open connection's packets
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await client.get("k")
        assert time.monotonic() - started < COMMAND_TIMEOUT_S + 1.5  # the run's Redis-away handling takes over
        assert await client.get("k") == b"v"
    finally:
        await client.aclose()
