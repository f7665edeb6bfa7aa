"""A request's life: cancel when the client leaves, seq gaps refilled from the journal, duplicates dropped."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from shared import codec, keys
from shared.errors import DeadlineExceeded
from shared.messages import CancelRequest, ChoiceEndEvent, DoneEvent, TokenEvent, Usage

pytestmark = pytest.mark.anyio

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


async def call_app(app: Any, path: str, body: dict[str, Any], leave: asyncio.Event, spec: str = "2.3") -> list[dict[str, Any]]:
    """Drive the ASGI app directly; the client 'disconnects' once `leave` is set."""
    raw = json.dumps(body).encode()
    pending = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        """The request body, then (once told) the disconnect."""
        if pending:
            return pending.pop(0)
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        """Record what the app sends; fail like a dead socket after the disconnect (spec 2.4)."""
        if leave.is_set() and spec == "2.4":
            raise OSError("connection reset")
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("gateway", 80),
    }
    await app(scope, receive, send)
    return sent


async def _next_cancel(pubsub: Any) -> CancelRequest:
    for _ in range(200):
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01)
        if message is not None:
            notice = codec.decode(message["data"])
            assert isinstance(notice, CancelRequest)
            return notice
    raise AssertionError("no cancel was published")


@pytest.fixture
async def cancels(redis):
    """A subscription to the model's cancel channel."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.cancel_channel("smollm2"))
    yield pubsub
    await pubsub.aclose()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])  # OpenAI's SSE, Ollama's NDJSON
@pytest.mark.parametrize("spec", ["2.3", "2.4"])
async def test_client_leaving_a_stream_publishes_cancel(app_client, worker, redis, cancels, spec: str,
                                                        path: str) -> None:
    app, _ = app_client
    leave = asyncio.Event()
    call = asyncio.create_task(call_app(app, path, {**CHAT, "stream": True}, leave, spec))
    job = await worker.take()
    await worker.token(job, "Hel")
    await asyncio.sleep(0.05)
    leave.set()
    sent = await asyncio.wait_for(call, 5)
    assert sent[0]["status"] == 200
    assert b'"content":"Hel"' in b"".join(m.get("body", b"") for m in sent)
    notice = await _next_cancel(cancels)
    assert (notice.id, notice.model, notice.reason) == (job.id, "smollm2", "client_disconnected")
    assert await redis.get(keys.cancelled_marker(job.model, job.id)) == b"1"
    assert 0 < await redis.ttl(keys.cancelled_marker(job.model, job.id)) <= 5 + 60 + 1
    assert app.state.broker.subscriber.active == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
async def test_client_leaving_a_non_streaming_request_publishes_cancel(app_client, worker, redis, cancels,
                                                                       path: str) -> None:
    app, _ = app_client
    leave = asyncio.Event()
    call = asyncio.create_task(call_app(app, path, {**CHAT, "stream": False}, leave))
    job = await worker.take()
    leave.set()
    await asyncio.wait_for(call, 5)
    notice = await _next_cancel(cancels)
    assert notice.id == job.id
    assert app.state.broker.subscriber.active == 0


async def test_finished_requests_publish_no_cancel_and_drop_their_journal(client, worker, redis, cancels) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    await worker.answer(job, ["ok"])
    assert (await task).status_code == 200
    assert await cancels.get_message(ignore_subscribe_messages=True, timeout=0.05) is None
    assert await redis.exists(keys.journal_stream(job.model, job.id)) == 0
    assert await redis.exists(keys.cancelled_marker(job.model, job.id)) == 0


async def test_a_gap_is_refilled_from_the_journal(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    await worker.token(job, "A")
    await worker.send(TokenEvent(id=job.id, seq=worker.next_seq(job.id), text="B", token_ids=[2]), publish=False)
    await worker.token(job, "C")
    await worker.end(job)
    await worker.done(job)
    data = (await task).json()
    assert data["choices"][0]["message"]["content"] == "ABC"


async def test_duplicates_are_dropped(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    first = TokenEvent(id=job.id, seq=worker.next_seq(job.id), text="A", token_ids=[1])
    await worker.send(first)
    await worker.send(first, journal=False)  # e.g. replayed by a replacement worker
    await worker.token(job, "B")
    await worker.end(job)
    await worker.done(job)
    assert (await task).json()["choices"][0]["message"]["content"] == "AB"


async def test_a_gap_the_journal_cannot_fill_is_an_error_and_cancels(client, worker, cancels) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    await worker.token(job, "A")
    worker.next_seq(job.id)  # seq 1 is lost: neither journaled nor published
    await worker.token(job, "C")
    response = await task
    assert response.status_code == 500
    assert "were lost" in response.json()["error"]["message"]
    assert (await _next_cancel(cancels)).id == job.id


async def test_after_a_reconnect_events_are_read_back_from_the_journal(app_client, worker) -> None:
    app, client = app_client
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    # Published while the gateway's pub/sub connection was down: only the journal has them.
    for event in (
        TokenEvent(id=job.id, seq=0, text="X", token_ids=[1]),
        ChoiceEndEvent(id=job.id, seq=1, finish_reason="stop"),
        DoneEvent(id=job.id, seq=2, usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)),
    ):
        await worker.send(event, publish=False)
    # what the connection delivers once a re-dial subscribed the channel again
    app.state.broker.subscriber._dispatch({"type": "subscribe", "channel": keys.events_channel(job.model, job.id).encode()})
    assert (await task).json()["choices"][0]["message"]["content"] == "X"


async def test_a_worker_deadline_error_is_504(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    job = await worker.take()
    await worker.send(DeadlineExceeded("deadline passed in the queue").to_event(job.id, 0))
    response = await task
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"


async def test_unreadable_events_fail_the_request(client, worker, redis) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    await redis.publish(keys.events_channel(job.model, job.id), b"\x93garbage")
    response = await task
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


async def test_client_leaving_before_the_first_event_of_a_stream_publishes_cancel(app_client, worker, cancels) -> None:
    app, _ = app_client
    leave = asyncio.Event()
    call = asyncio.create_task(call_app(app, "/v1/chat/completions", {**CHAT, "stream": True}, leave))
    job = await worker.take()  # queued; the worker has not started it
    leave.set()
    sent = await asyncio.wait_for(call, 5)
    assert sent[0]["status"] == 499  # nobody reads it: the client is gone
    assert (await _next_cancel(cancels)).id == job.id
    assert app.state.broker.subscriber.active == 0



def _hold_xadd_replies(broker: Any, written: asyncio.Event) -> None:
    """Make the job-writing pipeline execute on Redis and then never answer (the reply is in flight)."""
    real_pipeline = broker.redis.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        async def execute(*a: Any, **kw: Any) -> Any:
            writes_job = any(command[0][0] in ("XADD", "EVAL") for command in pipe.command_stack)  # EVAL: fair queue
            result = await real_execute(*a, **kw)
            if writes_job:
                written.set()
                await asyncio.Event().wait()  # the reply never comes back before the client leaves
            return result

        pipe.execute = execute
        return pipe

    broker.redis.pipeline = pipeline


@pytest.mark.parametrize("stream", [True, False])
async def test_leaving_while_the_job_is_written_cancels_it(app_client, worker, redis, cancels, stream) -> None:
    app, _ = app_client
    written, leave = asyncio.Event(), asyncio.Event()
    _hold_xadd_replies(app.state.broker, written)
    call = asyncio.create_task(call_app(app, "/v1/chat/completions", {**CHAT, "stream": stream}, leave))
    await asyncio.wait_for(written.wait(), 5)
    leave.set()
    sent = await asyncio.wait_for(call, 5)
    assert sent[0]["status"] == 499
    entries = await redis.xrange(keys.jobs_stream("smollm2"))  # in its stream, its write never confirmed
    job = codec.decode_job(entries[0][1][keys.JOB_FIELD.encode()])
    assert (await _next_cancel(cancels)).id == job.id
    assert await redis.get(keys.cancelled_marker(job.model, job.id)) == b"1"  # a worker taking it ends it unstarted
    assert app.state.broker.subscriber.active == 0


async def test_leaving_before_the_body_is_read_is_an_info_line(app_client, caplog) -> None:
    app, _ = app_client

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json"),
                                                                (b"content-length", b"100")],
             "client": ("127.0.0.1", 5000), "server": ("gateway", 80)}
    with caplog.at_level(logging.INFO):
        await app(scope, receive, send)
    assert sent[0]["status"] == 499
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("client disconnected" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
async def test_client_leaving_a_queued_stream_publishes_cancel(app_client, worker, cancels, spec: str) -> None:
    """The stream opened with `: queued` and keep-alives while its job waits; then the client leaves."""
    app, _ = app_client
    leave = asyncio.Event()
    call = asyncio.create_task(call_app(app, "/v1/chat/completions", {**CHAT, "stream": True}, leave, spec))
    job = await worker.take()  # queued; no worker starts it
    await asyncio.sleep(1.5)
    leave.set()
    sent = await asyncio.wait_for(call, 5)
    assert sent[0]["status"] == 200 and b": queued" in b"".join(m.get("body", b"") for m in sent)
    assert (await _next_cancel(cancels)).id == job.id
    assert app.state.broker.subscriber.active == 0
