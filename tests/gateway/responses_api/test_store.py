"""Stored responses: written with a TTL under the one key name, scoped to the API key that made them, a
running one orphaned by its gateway reads as failed, and what cannot be read is a 404 (Redis away: a 503)."""

from __future__ import annotations

import dataclasses
import time

import fakeredis
import pytest
from redis.asyncio import Redis

from gateway.responses_api.store import ResponseStore, StoredResponse
from shared import keys
from shared.errors import PreviousResponseNotFound, ResponseNotFound, Unavailable
from shared.settings import Settings

pytestmark = pytest.mark.anyio
SETTINGS = Settings(responses_ttl_s=3600, retry_after_s=1)
HISTORY = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
OUTPUT = [{"id": "rs_1", "type": "reasoning", "status": "completed", "summary": [],
           "content": [{"type": "reasoning_text", "text": "Hm."}]},
          {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]},
          {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "f",
           "arguments": "{}"}]


def record(status: str = "completed", key: str | None = None, deadline: float | None = None) -> StoredResponse:
    return StoredResponse(response={"id": "resp_1", "status": status, "output": OUTPUT}, history=HISTORY,
                          request_id="req-1", model="m", key=key, deadline=deadline or time.time() + 60)


@pytest.fixture
async def redis():
    client = fakeredis.FakeAsyncRedis()
    yield client
    await client.aclose()


async def test_a_record_round_trips_with_its_ttl_and_continues_its_conversation(redis) -> None:
    store = ResponseStore(redis, SETTINGS)
    await store.save(record())
    assert 3590 < await redis.ttl(keys.response_key("resp_1")) <= 3600
    loaded = await store.load("resp_1", None)
    assert loaded == record(deadline=loaded.deadline)
    assert loaded.conversation == [*HISTORY,  # output items keep their ids; the reasoning is carried over
                                   {"id": "rs_1", "type": "reasoning", "summary": [],  # (a harmony template reads it)
                                    "content": [{"type": "reasoning_text", "text": "Hm."}]},
                                   {"id": "msg_1", "type": "message", "role": "assistant",
                                    "content": [{"type": "output_text", "text": "Hello"}]},
                                   {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f",
                                    "arguments": "{}"}]
    await store.delete("resp_1", None)
    with pytest.raises(ResponseNotFound):
        await store.load("resp_1", None)


async def test_another_key_sees_nothing(redis) -> None:
    store = ResponseStore(redis, SETTINGS)
    await store.save(record(key="alice"))
    assert (await store.load("resp_1", "alice")).key == "alice"
    for key in ("bob", None):
        with pytest.raises(ResponseNotFound):
            await store.load("resp_1", key)
        with pytest.raises(PreviousResponseNotFound) as caught:
            await store.load("resp_1", key, previous=True)
        assert caught.value.param == "previous_response_id" and caught.value.status == 404
    with pytest.raises(ResponseNotFound):
        await store.delete("resp_1", "bob")
    assert await redis.exists(keys.response_key("resp_1"))


async def test_a_running_record_past_its_deadline_reads_as_failed(redis) -> None:
    store = ResponseStore(redis, SETTINGS)
    await store.save(record("in_progress", deadline=time.time() - 3600))
    orphan = (await store.load("resp_1", None)).response
    assert orphan["status"] == "failed" and "stopped" in orphan["error"]["message"]
    await store.save(record("in_progress"))
    assert (await store.load("resp_1", None)).response["status"] == "in_progress"


async def test_an_unreadable_record_is_a_404(redis) -> None:
    await redis.set(keys.response_key("resp_1"), b"\x93not json")
    with pytest.raises(ResponseNotFound):
        await ResponseStore(redis, SETTINGS).load("resp_1", None)


async def test_redis_away_is_a_503() -> None:
    from llmfleet.redis_server import free_port

    client = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    store = ResponseStore(client, dataclasses.replace(SETTINGS))
    try:
        with pytest.raises(Unavailable) as caught:
            await store.load("resp_1", None)
        assert caught.value.status == 503
        with pytest.raises(Unavailable):
            await store.save(record())
        assert not await store.save_quietly(record())
    finally:
        await client.aclose()
