"""Resuming a stream (gateway/replies/resume.py) on the app with a fake worker: the rest after Last-Event-ID is the
undisturbed stream's own bytes, a client that left keeps its job for the grace time, and a stream that is gone is a
404 in the API's own shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from shared import keys
from shared.settings import Settings
from tests.gateway.test_lifecycle import call_app
from tests.support.sse import split_ids, without_comments

pytestmark = pytest.mark.anyio
CHAT = {"model": "smollm2", "stream": True, "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"include_usage": True}}


@pytest.fixture
def settings() -> Settings:
    """A client that leaves keeps its job 5 s, for a resume."""
    return Settings(registry_cache_s=0.0, request_timeout_s=5.0, deadline_grace_s=0.05, queue_limit=4,
                    orphan_grace_s=5.0)


def _frames(body: bytes) -> list[str]:
    """The SSE events of a body, each with its `id:` line (comments left out)."""
    frames = (without_comments(frame.encode()).decode() for frame in body.decode().split("\n\n"))
    return [frame for frame in frames if frame]


async def _streamed(client: httpx.AsyncClient, worker: Any, path: str, body: dict[str, Any]) -> bytes:
    task = asyncio.create_task(client.post(path, json=body))
    job = await worker.take()
    await worker.answer(job, ["Hel", "lo", " there"])
    response = await task
    assert response.status_code == 200
    return response.content


@pytest.mark.parametrize(("path", "route", "body"), [
    ("/v1/chat/completions", "/v1/chat/completions/{id}/stream", CHAT),
    ("/v1/completions", "/v1/completions/{id}/stream", {"model": "smollm2", "prompt": "hi", "stream": True}),
    ("/v1/messages", "/v1/messages/{id}/stream", {**CHAT, "max_tokens": 10}),
])
async def test_a_resume_after_any_event_sends_exactly_the_rest(client, worker, path, route, body) -> None:
    whole = await _streamed(client, worker, path, body)
    frames = _frames(whole)
    ids, _ = split_ids(whole.decode())
    assert ids == list(range(len(ids))) and len(ids) >= 4
    first = json.loads(frames[0].split("data: ", 1)[1])
    stream_id = first["id"] if "id" in first else first["message"]["id"]
    for after in (-1, 0, 2, ids[-1]):
        headers = {"Last-Event-ID": str(after)} if after >= 0 else {}
        again = await client.get(route.format(id=stream_id), headers=headers)
        assert again.status_code == 200, again.text
        rest = [f for f in frames if not f.startswith("id: ") or int(f.split("\n")[0][4:]) > after]
        assert _frames(again.content) == rest


async def test_a_client_that_left_resumes_the_running_job_and_it_is_not_cancelled(app_client, worker, redis) -> None:
    app, client = app_client
    leave = asyncio.Event()
    call = asyncio.create_task(call_app(app, "/v1/chat/completions", CHAT, leave))
    job = await worker.take()
    await worker.token(job, "Hel")
    await asyncio.sleep(0.1)
    leave.set()
    sent = b"".join(m.get("body", b"") for m in await asyncio.wait_for(call, 5))
    got = _frames(sent)
    last = int(got[-1].split("\n")[0][4:])
    stream_id = "chatcmpl-" + job.id.removeprefix("req-")
    assert await redis.zscore(keys.ORPHANS, stream_id) is not None  # nobody listens: due for a cancel
    resumed = asyncio.create_task(client.get(f"/v1/chat/completions/{stream_id}/stream",
                                             headers={"Last-Event-ID": str(last)}))
    await asyncio.sleep(0.3)
    assert await redis.zscore(keys.ORPHANS, stream_id) is None  # taken over
    assert await redis.hget(keys.stream_record(stream_id), "owner") == app.state.broker.streams.gateway_id.encode()
    await worker.token(job, "lo")
    await worker.end(job)
    await worker.done(job)
    response = await resumed
    text = "".join(json.loads(f.split("data: ", 1)[1])["choices"][0]["delta"].get("content", "")
                   for f in [*got, *_frames(response.content)] if '"choices":[{' in f)
    assert text == "Hello"
    assert not await redis.exists(keys.cancelled_marker(job.model, job.id))
    assert await redis.hget(keys.stream_record(stream_id), "owner") == b"done"


async def test_an_unknown_stream_is_a_404_in_the_apis_shape(client) -> None:
    openai = await client.get("/v1/chat/completions/chatcmpl-nope/stream", headers={"Last-Event-ID": "3"})
    assert openai.status_code == 404 and openai.json()["error"]["code"] == "stream_not_found"
    anthropic = await client.get("/v1/messages/msg_nope/stream")
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    responses = await client.get("/v1/responses/resp_nope?stream=true&starting_after=2")
    assert responses.status_code == 404 and responses.json()["error"]["code"] == "stream_not_found"
    bad = await client.get("/v1/chat/completions/chatcmpl-nope/stream", headers={"Last-Event-ID": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"


async def test_a_stream_whose_journal_is_gone_is_a_404_not_a_silent_wait(client, worker, redis) -> None:
    """As after a Redis restart that kept the record but lost the events (or a journal past its retention)."""
    whole = await _streamed(client, worker, "/v1/chat/completions", CHAT)
    stream_id = json.loads(_frames(whole)[0].split("data: ", 1)[1])["id"]
    await redis.delete(keys.journal_stream("smollm2", "req-" + stream_id.removeprefix("chatcmpl-")))
    again = await client.get(f"/v1/chat/completions/{stream_id}/stream", headers={"Last-Event-ID": "1"})
    assert again.status_code == 404 and again.json()["error"]["code"] == "stream_not_found"


async def test_a_background_response_streams_and_resumes_after_starting_after(client, worker, redis) -> None:
    body = {"model": "smollm2", "input": "hi", "stream": True, "background": True}
    task = asyncio.create_task(client.post("/v1/responses", json=body))
    job = await worker.take()
    await worker.answer(job, ["Hel", "lo"])
    whole = (await task).content
    frames = _frames(whole)
    events = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    assert [e["sequence_number"] for e in events] == [int(f.split("\n")[0][4:]) for f in frames]
    assert events[-1]["type"] == "response.completed", events[-2:]
    rid = events[0]["response"]["id"]
    again = await client.get(f"/v1/responses/{rid}?stream=true&starting_after=3")
    assert _frames(again.content) == frames[4:]
    for _ in range(50):  # the background task stores the final object
        stored = (await client.get(f"/v1/responses/{rid}")).json()
        if stored["status"] == "completed":
            break
        await asyncio.sleep(0.02)
    assert stored["output"][0]["content"][0]["text"] == "Hello"
