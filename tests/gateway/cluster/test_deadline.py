"""The gateway enforces the deadline when no terminal event arrives in time."""

from __future__ import annotations

import asyncio

import pytest

from shared import codec, keys
from shared.messages import CancelRequest
from shared.settings import Settings

pytestmark = pytest.mark.anyio

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def settings() -> Settings:
    """A very short request timeout; a stream opens (`: queued`) only well after it, so that no answer by the
    deadline is still a plain 504 (at the default 0.25 s both fell due at once and either could win)."""
    return Settings(registry_cache_s=0.0, request_timeout_s=0.2, deadline_grace_s=0.05, sse_queued_after_s=2.0)


@pytest.mark.parametrize("stream", [False, True])
async def test_no_answer_before_the_deadline_is_504_and_cancels(client, worker, redis, stream: bool) -> None:
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.cancel_channel("smollm2"))
    task = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": stream}))
    job = await worker.take()
    assert job.deadline - job.created == pytest.approx(0.2)
    response = await asyncio.wait_for(task, 5)
    assert response.status_code == 504
    assert response.json()["error"] == {
        "message": f"request {job.id} did not finish before its deadline",
        "type": "server_error",
        "param": None,
        "code": "deadline_exceeded",
    }
    message = None
    for _ in range(100):
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01)
        if message:
            break
    assert message is not None
    notice = codec.decode(message["data"])
    assert isinstance(notice, CancelRequest) and (notice.id, notice.reason) == (job.id, "deadline")
    await pubsub.aclose()


async def test_deadline_after_the_stream_began_is_a_final_sse_error(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    job = await worker.take()
    await worker.token(job, "slow")
    response = await asyncio.wait_for(task, 5)
    assert response.status_code == 200
    assert b'"code":"deadline_exceeded"' in response.content
    assert response.content.endswith(b"data: [DONE]\n\n")
