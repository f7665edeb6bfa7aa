"""Many concurrent streams (streaming and not) share the gateway's one pub/sub connection."""

from __future__ import annotations

import asyncio

import pytest

from shared import keys

pytestmark = pytest.mark.anyio

N = 100


async def test_many_concurrent_streams(app_client, worker, redis, settings) -> None:
    app, client = app_client
    object.__setattr__(settings, "queue_limit", N)  # frozen; tests may bend it
    bodies = [
        {"model": "smollm2", "messages": [{"role": "user", "content": f"q{i}"}], "stream": i % 2 == 0} for i in range(N)
    ]
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=b)) for b in bodies]
    jobs = [await worker.take() for _ in range(N)]
    assert app.state.broker.subscriber.active == N
    channels = await redis.pubsub_channels(keys.events_channel("smollm2", "*"))
    assert len(channels) == N
    for job in jobs:
        await worker.answer(job, [job.messages[0].content, "!"])  # type: ignore[index]
    responses = await asyncio.gather(*tasks)
    for body, response in zip(bodies, responses, strict=True):
        question = body["messages"][0]["content"]  # type: ignore[index]
        if body["stream"]:
            assert f'"content":"{question}"'.encode() in response.content
            assert response.content.endswith(b"data: [DONE]\n\n")
        else:
            assert response.json()["choices"][0]["message"]["content"] == f"{question}!"
    assert app.state.broker.subscriber.active == 0
    assert await redis.pubsub_channels(keys.events_channel("smollm2", "*")) == []
