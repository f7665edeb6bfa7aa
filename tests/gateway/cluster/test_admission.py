"""Admission that keeps its promise: refuse work that cannot finish well before its deadline, check n against the
workers' width, and open a queued stream at once with `: queued` and keep-alives."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.cluster.admission import check_width, decide, expected_finish_s, retry_after_s
from shared.errors import InvalidRequest, QueueFull
from shared.messages import GenerateJob
from shared.registry import RegistryEntry

pytestmark = pytest.mark.anyio
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _entry(slots: int, load: int, rate: float, **stats: float) -> RegistryEntry:
    now = time.time()
    return RegistryEntry(worker_id="w", model="m", slots=slots, heartbeat=now, started=now, load=load,
                         stats={"finish_rate": rate, **stats})


def test_the_expected_finish_is_the_work_in_flight_and_ahead_over_the_measured_rates() -> None:
    # requests: 8 in flight + 49 waiting + itself, at 5 requests/s
    assert expected_finish_s([_entry(4, 4, 2.0), _entry(4, 4, 3.0)], waiting=49) == 58 / 5.0
    assert expected_finish_s([_entry(4, 2, 2.0)], waiting=1) == 0.0  # a free slot: starts at once
    assert expected_finish_s([_entry(4, 4, 0.0)], waiting=100) == 0.0  # no rate measured yet: the count limit rules
    # in a burst the heartbeat's load (0) is stale; the 4 jobs taken and not acked, read live, fill the slots
    assert expected_finish_s([_entry(4, 0, 2.0)], waiting=0, in_flight=4) == (4 + 0 + 1) / 2.0
    # right after a burst ended the heartbeat still says 4; nothing is in flight: the slots are free
    assert expected_finish_s([_entry(4, 4, 0.01)], waiting=3, in_flight=0) == 0.0
    # tokens: the rate was measured on short jobs (10 requests/s), but 400 tokens are left in flight and the
    # new job and the 2 waiting ahead of it may generate 200 each: (400 + 3 x 200) / 100 tokens/s
    long_jobs = [_entry(4, 4, 10.0, token_rate=100.0, tokens_left=400.0)]
    assert expected_finish_s(long_jobs, waiting=2, tokens=200) == 10.0
    short_jobs = [_entry(4, 4, 10.0, token_rate=100.0, tokens_left=20.0)]
    assert expected_finish_s(short_jobs, waiting=2, tokens=2) == (4 + 2 + 1) / 10.0  # the larger: by requests
    assert retry_after_s(400.0, 300.0) == 60 and retry_after_s(300.5, 300.0) == 1


def test_fresh_workers_are_judged_by_half_their_measured_decode_capacity() -> None:
    # nothing generated yet (no finish or token rate), but a full decode step ran at 200 tokens/s at start:
    # 1,000 tokens left in flight + (9 waiting + itself) x 100 tokens, at 0.5 x 200 tokens/s
    fresh = [_entry(4, 4, 0.0, decode_capacity=200.0, tokens_left=1000.0)]
    assert expected_finish_s(fresh, waiting=9, tokens=100) == 2000 / 100.0
    # a measured token rate above half the capacity wins
    busy = [_entry(4, 4, 0.0, decode_capacity=200.0, token_rate=150.0, tokens_left=1000.0)]
    assert expected_finish_s(busy, waiting=9, tokens=100) == 2000 / 150.0


def test_rates_measured_under_a_light_load_are_scaled_to_a_full_worker() -> None:
    """One stream's rates (0.2 requests/s at 35 tokens/s, one sequence in flight) would make a 64-slot worker look
    as if it ran one request at a time: full, it generates 64 times the tokens up to its 200 tokens/s capacity,
    and finishes requests as much faster."""
    from gateway.cluster.admission import full_finish_rate, full_token_rate

    light = _entry(64, 64, 0.2, token_rate=35.0, decode_capacity=200.0, finish_load=1.0)
    assert full_token_rate(light) == 200.0
    assert full_finish_rate(light) == pytest.approx(0.2 * 200.0 / 35.0)
    # 64 in flight, 63 waiting, and itself: by requests 128 / 1.14 = 112 s, not 640 s
    assert expected_finish_s([light], waiting=63, in_flight=64) == pytest.approx(128 / (0.2 * 200.0 / 35.0))
    # measured at 48 of 64 slots: tokens scaled by 4/3 (below the capacity), requests alike
    fuller = _entry(64, 48, 0.2, token_rate=120.0, decode_capacity=200.0, finish_load=48.0)
    assert full_token_rate(fuller) == pytest.approx(160.0) and full_finish_rate(fuller) == pytest.approx(0.2 * 4 / 3)
    # measured full: as measured (tokens at least half the capacity, the floor a fresh worker gets)
    full = _entry(64, 64, 2.0, token_rate=80.0, decode_capacity=200.0, finish_load=64.0)
    assert full_token_rate(full) == 100.0 and full_finish_rate(full) == 2.0
    # no load known (an older worker), or no tokens generated (embeddings): the finish rate as measured
    assert full_finish_rate(_entry(4, 4, 10.0, token_rate=100.0)) == 10.0
    assert full_finish_rate(_entry(4, 4, 3.0, token_rate=0.0, finish_load=1.0)) == 3.0


def test_decide_is_the_whole_rule_with_no_io() -> None:
    job = GenerateJob(id="r", model="m", created=0, deadline=60, prompt="x", max_tokens=100, n=1)
    limits = {"queue_limit": 10, "request_timeout_s": 40.0, "default_max_tokens": 50, "retry_after": 2.0}
    idle = [_entry(4, 0, 1.0)]
    decide(job, idle, waiting=0, in_flight=0, **limits)  # a free slot: admitted
    with pytest.raises(QueueFull) as full:
        decide(job, idle, waiting=10, in_flight=4, **limits)  # the count limit
    assert full.value.retry_after == 2.0 and "limit is 10" in full.value.message
    slow = [_entry(4, 4, 0.5, token_rate=10.0, tokens_left=400.0)]  # (400 + 3 x 100) / 10 = 70 s > 20 s
    with pytest.raises(QueueFull) as late:
        decide(job, slow, waiting=2, in_flight=4, **limits)
    assert late.value.retry_after == retry_after_s(70.0, 20.0) == 50
    unbounded = GenerateJob(id="r", model="m", created=0, deadline=60, prompt="x")  # counted at the default 50
    decide(unbounded, [_entry(4, 4, 0.5, token_rate=10.0, tokens_left=0.0)], waiting=2, in_flight=4, **limits)
    check_width(GenerateJob(id="r", model="m", created=0, deadline=60, prompt="x", n=4), idle)
    with pytest.raises(InvalidRequest) as wide:
        check_width(GenerateJob(id="r", model="m", created=0, deadline=60, prompt="x", n=5), idle)
    assert wide.value.param == "n"


async def _fill(client: httpx.AsyncClient, worker: Any, count: int = 8) -> tuple[list[asyncio.Task], list[Any]]:
    """`count` requests taken by the worker and not yet answered: the live in-flight load admission reads."""
    tasks, jobs = [], []
    for _ in range(count):  # one at a time: the queue limit (4) counts requests not yet taken
        tasks.append(asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)))
        jobs.append(await worker.take())
    return tasks, jobs


async def _release(worker: Any, tasks: list[asyncio.Task], jobs: list[Any]) -> None:
    """Answer the filling requests; each ends 200."""
    for job in jobs:
        await worker.answer(job, ["ok"])
    assert [(await task).status_code for task in tasks] == [200] * len(tasks)


async def test_a_request_that_could_not_finish_before_its_deadline_is_a_429(
        client: httpx.AsyncClient, worker: Any) -> None:
    # settings: request_timeout_s 5 -> budget 2.5 s; a full worker (8 in flight) finishing 4 requests/s: the
    # first two queued ones finish after 2.25 s and 2.5 s, a third would after 2.75 s
    await worker.register(load=8, **{"stat.finish_rate": 4.0})
    filling, taken = await _fill(client, worker)
    queued = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(2)]
    await asyncio.sleep(0.3)
    refused = await client.post("/v1/chat/completions", json=CHAT)
    assert refused.status_code == 429, refused.text
    assert "before its deadline" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "1"  # ceil(2.75 - 2.5)
    await worker.register(load=8, **{"stat.finish_rate": 1.0})  # slower: (8 + 2 + 1) / 1 -> ceil(11 - 2.5)
    assert (await client.post("/v1/chat/completions", json=CHAT)).headers["retry-after"] == "9"
    # long jobs: by tokens, 200 left in flight + 3 x 2 at 50 tokens/s is 4.1 s, though requests finish fast
    await worker.register(load=8, **{"stat.finish_rate": 100.0, "stat.token_rate": 50.0, "stat.tokens_left": 200})
    assert (await client.post("/v1/chat/completions", json=CHAT)).headers["retry-after"] == "2"
    await worker.register(load=8, **{"stat.finish_rate": 10.0, "stat.token_rate": 0.0})  # faster: done after 1.1 s
    queued.append(asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)))
    for _ in range(3):
        await worker.answer(await worker.take(), ["ok"])
    assert [(await task).status_code for task in queued] == [200, 200, 200]
    await _release(worker, filling, taken)


async def test_a_burst_is_judged_with_its_own_requests_counted(client: httpx.AsyncClient, worker: Any) -> None:
    """Requests admitted at the same moment see each other before they reach the stream: of six at once on a full
    worker finishing 4 requests/s (budget 2.5 s), two are admitted (2.25 s, 2.5 s), four refused."""
    await worker.register(load=8, **{"stat.finish_rate": 4.0})
    filling, taken = await _fill(client, worker)
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(6)]
    await asyncio.sleep(0.5)
    refused = [t.result() for t in tasks if t.done()]
    assert len(refused) == 4 and all(r.status_code == 429 and r.headers["retry-after"] for r in refused)
    for _ in range(2):
        await worker.answer(await worker.take(), ["ok"])
    assert sorted(r.status_code for r in await asyncio.gather(*tasks)) == [200, 200, 429, 429, 429, 429]
    await _release(worker, filling, taken)


async def test_n_wider_than_any_worker_is_a_400_naming_n(client: httpx.AsyncClient, worker: Any) -> None:
    await worker.register(slots=2)
    reply = await client.post("/v1/chat/completions", json={**CHAT, "n": 3})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "n"
    assert "at most 2 sequences" in reply.json()["error"]["message"]


@pytest.fixture
async def patient_app(settings: Any, server: Any) -> Any:
    """A gateway that opens a queued stream after 0.1 s and sends a keep-alive every 0.2 s."""
    import fakeredis
    from redis.asyncio import BlockingConnectionPool

    quick = dataclasses.replace(settings, sse_queued_after_s=0.1, sse_keepalive_s=0.2, request_timeout_s=30.0)
    redis = fakeredis.FakeAsyncRedis(server=server, connection_pool_class=BlockingConnectionPool, max_connections=64)
    app = create_app(quick, redis=redis)
    async with app.router.lifespan_context(app):
        yield app
    await redis.aclose()


async def _post_stream(app: Any, body: dict[str, Any], sent: list[dict[str, Any]],
                       path: str = "/v1/chat/completions") -> None:
    """Drive one streaming POST through the ASGI app, recording every message it sends (httpx's ASGI transport
    would only hand the response over once it is complete)."""
    request = {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal request
        if request is not None:
            message, request = request, None
            return message
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"), (b"host", b"gateway")],
             "client": ("127.0.0.1", 1), "server": ("gateway", 80), "app": app}
    await app(scope, receive, send)


def _body(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_a_queued_stream_opens_at_once_with_queued_and_keep_alives(patient_app: Any, worker: Any) -> None:
    sent: list[dict[str, Any]] = []
    call = asyncio.create_task(_post_stream(patient_app, {**CHAT, "stream": True}, sent))
    await asyncio.sleep(0.6)  # the job still waits in the queue: no worker took it
    assert sent and sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    early = _body(sent)
    assert early.startswith(b": queued\n") and b": keep-alive\n" in early and b"data:" not in early
    await worker.answer(await worker.take(), ["Hello"])
    await asyncio.wait_for(call, 5)
    body = _body(sent)
    assert b'"content":"Hello"' in body and body.endswith(b"data: [DONE]\n\n")


async def test_a_queued_stream_that_then_fails_ends_with_an_error_chunk(patient_app: Any, worker: Any) -> None:
    from shared.errors import ContextLengthExceeded

    sent: list[dict[str, Any]] = []
    call = asyncio.create_task(_post_stream(patient_app, {**CHAT, "stream": True}, sent))
    await asyncio.sleep(0.3)
    job = await worker.take()
    await worker.send(ContextLengthExceeded("too long", param="messages").to_event(job.id, worker.next_seq(job.id)))
    await asyncio.wait_for(call, 5)
    text = _body(sent).decode()
    assert sent[0]["status"] == 200 and text.startswith(": queued\n")
    assert '"code":"context_length_exceeded"' in text and text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"], ids=["openai", "anthropic"])
async def test_a_stream_that_waits_mid_way_sends_keep_alives(patient_app: Any, worker: Any, path: str) -> None:
    """Its worker died after the first token: while another resumes it, the client gets a keep-alive comment
    every sse_keepalive_s (0.2 s here), whatever API the stream speaks."""
    sent: list[dict[str, Any]] = []
    call = asyncio.create_task(_post_stream(patient_app, {**CHAT, "stream": True}, sent, path))
    job = await worker.take()
    await worker.token(job, "Hel")
    await asyncio.sleep(0.75)  # failover: no event for a while
    after_first = _body(sent).split(b"Hel", 1)
    assert len(after_first) == 2 and after_first[1].count(b": keep-alive\n") >= 2
    await worker.token(job, "lo")
    await worker.end(job)
    await worker.done(job)
    await asyncio.wait_for(call, 5)
    assert b"lo" in _body(sent).split(b"Hel", 1)[1]
