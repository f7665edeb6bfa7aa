"""Anthropic messages through the unmodified anthropic SDK against the gateway and a scripted worker: message
bodies, the exact event sequence of streams, tool_use blocks, stop reasons, count_tokens and error shapes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from shared.errors import ContextLengthExceeded, QueueFull
from shared.messages import ChoiceEndEvent, DoneEvent, Usage
from tests.support.sse import split_ids

anthropic_sdk = pytest.importorskip("anthropic")
pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"name": "get_weather", "description": "The weather now",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = ['<tool_call>\n{"name": "get_', 'weather", "arguments": {"ci', 'ty": "Pa}ris"}}\n</tool_call>']


@pytest.fixture(autouse=True)
def _request_ids(fixed_request_id: None) -> None:
    """Every test here sees req-0123, req-0124, ... (tests/gateway/conftest.py)."""


@pytest.fixture
def sdk(app_client) -> Any:
    app, _ = app_client
    httpx2 = pytest.importorskip("httpx2")  # the anthropic SDK's own HTTP package
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gateway")
    return anthropic_sdk.AsyncAnthropic(api_key="unused", base_url="http://gateway", http_client=http, max_retries=0)


def sse_events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of every SSE event; asserts each is named after its data's type."""
    out = []
    ids, blocks = split_ids(body.decode())
    assert ids in ([], list(range(len(blocks))))
    for block in blocks:
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


async def test_a_message_has_anthropics_shape(sdk, worker) -> None:
    task = asyncio.create_task(sdk.messages.create(model="smollm2", max_tokens=16, messages=ASK))
    job = await worker.take()
    assert job.max_tokens == 16 and job.messages[0].content == "Weather in Paris?" and not job.stream
    await worker.answer(job, ["Sunny", ", 21 C."])
    message = await task
    assert message.id == "msg_0123" and message.type == "message" and message.role == "assistant"
    assert message.model == "smollm2" and message.stop_reason == "end_turn" and message.stop_sequence is None
    assert [(b.type, b.text) for b in message.content] == [("text", "Sunny, 21 C.")]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 2)


@pytest.mark.parametrize(("reason", "stop", "expected"), [
    ("length", None, "max_tokens"), ("stop", "END", "stop_sequence"), ("stop", None, "end_turn")])
async def test_stop_reasons(sdk, worker, reason: str, stop: str | None, expected: str) -> None:
    task = asyncio.create_task(sdk.messages.create(model="smollm2", max_tokens=16, messages=ASK,
                                                   stop_sequences=["END"]))
    job = await worker.take()
    assert job.stop == ["END"]
    await worker.token(job, "Sunny")
    await worker.send(ChoiceEndEvent(id=job.id, seq=worker.next_seq(job.id), finish_reason=reason,
                                     stop_sequence=stop))
    await worker.done(job)
    message = await task
    assert (message.stop_reason, message.stop_sequence) == (expected, stop)


async def test_a_stream_sends_anthropics_events_in_order(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/messages", json={
        "model": "smollm2", "max_tokens": 16, "messages": ASK, "stream": True}))
    job = await worker.take()
    assert job.stream
    for text in ["Sun", "", "ny"]:
        await worker.token(job, text)
    await worker.end(job)
    usage = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8, cached_tokens=2)
    await worker.send(DoneEvent(id=job.id, seq=worker.next_seq(job.id), usage=usage))
    response = await task
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.content)
    assert [name for name, _ in events] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                            "content_block_delta", "content_block_stop", "message_delta",
                                            "message_stop"]
    start = events[0][1]["message"]
    assert start["id"] == "msg_0123" and start["content"] == [] and start["stop_reason"] is None
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert [e["delta"] for _, e in events[3:5]] == [{"type": "text_delta", "text": "Sun"},
                                                    {"type": "text_delta", "text": "ny"}]
    assert events[6][1] == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": {"input_tokens": 3, "cache_creation_input_tokens": 0,
                                      "cache_read_input_tokens": 2, "output_tokens": 3}}
    assert not response.content.endswith(b"data: [DONE]\n\n")


async def test_the_sdk_stream_accumulates_the_same_message(sdk, worker) -> None:
    async def run() -> tuple[list[str], Any]:
        async with sdk.messages.stream(model="smollm2", max_tokens=16, messages=ASK) as stream:
            texts = [text async for text in stream.text_stream]
            return texts, await stream.get_final_message()

    task = asyncio.create_task(run())
    job = await worker.take()
    await worker.answer(job, ["Sun", "ny."], reason="length")
    texts, message = await task
    assert texts == ["Sun", "ny."] and message.content[0].text == "Sunny."
    assert message.stop_reason == "max_tokens" and message.usage.input_tokens == 3 and message.usage.output_tokens == 2


async def test_a_tool_call_is_a_tool_use_block_collected_and_streamed(sdk, worker) -> None:
    ask = {"model": "smollm2", "max_tokens": 64, "messages": ASK, "tools": [WEATHER],
           "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    task = asyncio.create_task(sdk.messages.create(**ask))
    job = await worker.take()
    assert job.tool_choice == "required" and not job.parallel_tool_calls and job.tools[0].name == "get_weather"
    await worker.answer(job, ["Checking. ", *CALL])
    whole = await task
    assert whole.stop_reason == "tool_use"
    text, call = whole.content
    assert text.type == "text" and text.text == "Checking."
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Pa}ris"}
    assert call.id.startswith("toolu_")

    async def run() -> tuple[list[Any], Any]:
        async with sdk.messages.stream(**ask) as stream:
            return [event async for event in stream], await stream.get_final_message()

    task = asyncio.create_task(run())
    job = await worker.take()
    await worker.answer(job, ["Checking. ", *CALL])
    events, streamed = await task
    raw = [e.type for e in events if e.type in ("content_block_start", "content_block_stop")]
    assert raw == ["content_block_start", "content_block_stop", "content_block_start", "content_block_stop"]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [(e.index, e.content_block.type) for e in starts] == [(0, "text"), (1, "tool_use")]
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == {"city": "Pa}ris"}
    assert streamed.stop_reason == "tool_use" and streamed.content[1].input == whole.content[1].input
    assert streamed.content[0].text == "Checking."


async def test_count_tokens_is_the_workers_prompt_count(sdk, worker) -> None:
    task = asyncio.create_task(sdk.messages.count_tokens(model="smollm2", messages=ASK, system="Be brief."))
    job = await worker.take()
    assert job.max_tokens == 0 and [m.role for m in job.messages] == ["system", "user"]
    await worker.end(job, reason="length")
    await worker.done(job, prompt_tokens=17, completion_tokens=0)
    assert (await task).input_tokens == 17


@pytest.mark.parametrize(("body", "status", "kind"), [
    ({"messages": ASK}, 400, "invalid_request_error"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}]}]},
     400, "invalid_request_error"),
    ({"model": "nope", "max_tokens": 8, "messages": ASK}, 404, "not_found_error"),
])
async def test_bad_input_gets_anthropics_error_shape(client, worker, body: dict[str, Any], status: int,
                                                     kind: str) -> None:
    response = await client.post("/v1/messages", json={"model": "smollm2", **body})
    assert response.status_code == status
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind and error["error"]["message"]
    assert set(error) == {"type", "error"} and set(error["error"]) == {"type", "message"}


async def test_the_sdk_raises_its_own_errors(sdk, worker) -> None:
    with pytest.raises(anthropic_sdk.BadRequestError) as caught:
        await sdk.messages.create(model="smollm2", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}]}])
    assert "image blocks are not supported" in caught.value.message
    assert caught.value.body["error"]["type"] == "invalid_request_error"


async def test_unknown_paths_and_methods_answer_in_anthropics_shape(client) -> None:
    response = await client.get("/v1/messages")
    assert response.status_code == 405 and response.json()["type"] == "error"
    assert (await client.post("/v1/messages/batches", json={})).json()["error"]["type"] == "not_found_error"
    assert "choices" not in (await client.post("/v1/chat/completions", json={})).json()["error"]  # OpenAI's shape
    assert (await client.post("/v1/chat/completions", json={})).json()["error"]["type"] == "invalid_request_error"


async def test_an_error_before_the_first_token_is_a_plain_http_error(sdk, worker) -> None:
    async def run() -> None:
        async with sdk.messages.stream(model="smollm2", max_tokens=8, messages=ASK) as stream:
            async for _ in stream:
                pass

    task = asyncio.create_task(run())
    job = await worker.take()
    await worker.send(ContextLengthExceeded("too long").to_event(job.id, worker.next_seq(job.id)))
    with pytest.raises(anthropic_sdk.BadRequestError):
        await task


async def test_an_error_after_the_stream_began_is_an_error_event(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/messages", json={
        "model": "smollm2", "max_tokens": 16, "messages": ASK, "stream": True}))
    job = await worker.take()
    await worker.token(job, "Sun")
    await worker.send(QueueFull("busy", retry_after=1).to_event(job.id, worker.next_seq(job.id)))
    events = sse_events((await task).content)
    assert [name for name, _ in events] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                            "error"]
    assert events[-1][1] == {"type": "error", "error": {"type": "rate_limit_error", "message": "busy"}}


async def test_the_middlewares_refusals_are_anthropic_shaped(server, worker) -> None:
    import dataclasses

    import fakeredis
    import httpx2
    from redis.asyncio import BlockingConnectionPool

    from gateway.app import create_app
    from shared.settings import Settings

    settings = dataclasses.replace(Settings(), registry_cache_s=0.0, api_key="sk-right", max_body_bytes=4096)
    redis = fakeredis.FakeAsyncRedis(server=server, connection_pool_class=BlockingConnectionPool, max_connections=8)
    app = create_app(settings, redis=redis)
    async with app.router.lifespan_context(app):
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gateway")
        wrong = anthropic_sdk.AsyncAnthropic(api_key="sk-wrong", base_url="http://gateway", http_client=http,
                                             max_retries=0)
        with pytest.raises(anthropic_sdk.AuthenticationError) as caught:
            await wrong.messages.create(model="smollm2", max_tokens=8, messages=ASK)
        assert caught.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                                "message": "Incorrect API key provided."}}
        right = wrong.with_options(api_key="sk-right")
        with pytest.raises(anthropic_sdk.APIStatusError) as too_large:
            await right.messages.create(model="smollm2", max_tokens=8,
                                        messages=[{"role": "user", "content": "x" * 5000}])
        assert too_large.value.status_code == 413
        assert too_large.value.body["error"]["type"] == "request_too_large"
        task = asyncio.create_task(right.messages.create(model="smollm2", max_tokens=8, messages=ASK))
        job = await worker.take()
        await worker.answer(job, ["ok"])
        assert (await task).content[0].text == "ok"  # x-api-key is accepted
        await http.aclose()
    await redis.aclose()


async def test_a_queued_stream_opens_with_comments_the_sdk_ignores(settings, server, worker) -> None:
    import dataclasses

    import fakeredis
    import httpx
    import httpx2
    from redis.asyncio import BlockingConnectionPool

    from gateway.app import create_app

    quick = dataclasses.replace(settings, sse_queued_after_s=0.1, sse_keepalive_s=0.2, request_timeout_s=30.0)
    redis = fakeredis.FakeAsyncRedis(server=server, connection_pool_class=BlockingConnectionPool, max_connections=64)
    app = create_app(quick, redis=redis)
    async with app.router.lifespan_context(app):
        raw = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
        task = asyncio.create_task(raw.post("/v1/messages", json={"model": "smollm2", "max_tokens": 8, "messages": ASK,
                                                                  "stream": True}))
        await asyncio.sleep(0.6)  # nobody took the job yet: the stream is open, with comments only
        await worker.answer(await worker.take(), ["Hi"])
        body = (await task).content
        assert body.startswith(b": queued\n: keep-alive\n") and b"event: message_start\n" in body

        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gateway")
        sdk = anthropic_sdk.AsyncAnthropic(api_key="unused", base_url="http://gateway", http_client=http, max_retries=0)

        async def run() -> Any:
            async with sdk.messages.stream(model="smollm2", max_tokens=8, messages=ASK) as stream:
                return await stream.get_final_message()

        task = asyncio.create_task(run())
        await asyncio.sleep(0.4)
        await worker.answer(await worker.take(), ["Hel", "lo"])
        assert (await task).content[0].text == "Hello"
        task = asyncio.create_task(run())
        await asyncio.sleep(0.3)
        job = await worker.take()
        await worker.send(ContextLengthExceeded("too long").to_event(job.id, worker.next_seq(job.id)))
        with pytest.raises(anthropic_sdk.APIStatusError) as caught:  # sent as `event: error` (the stream was open)
            await task
        assert caught.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": "too long"}}
        await raw.aclose()
        await http.aclose()
    await redis.aclose()


async def test_any_cut_only_in_a_further_call_stops_with_tool_use(sdk, client, worker) -> None:
    """Issue 42: `any` allows parallel calls (Anthropic's default); when max_tokens cuts only a further call, the
    complete one is a tool_use turn (a `while stop_reason == "tool_use"` loop runs it); usage counts the drop."""
    ask = {"model": "smollm2", "max_tokens": 40, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any"}}
    cut = '\n<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    task = asyncio.create_task(sdk.messages.with_raw_response.create(**ask))
    job = await worker.take()
    assert job.tool_choice == "required" and job.parallel_tool_calls
    await worker.answer(job, [*CALL, cut], reason="length")
    raw = await task
    whole = await raw.parse()
    assert whole.stop_reason == "tool_use" and [b.type for b in whole.content] == ["tool_use"]
    assert whole.usage.dropped_tool_calls == 1 and raw.headers["x-llmfleet-dropped-tool-calls"] == "1"
    task = asyncio.create_task(client.post("/v1/messages", json={**ask, "stream": True}))
    await worker.answer(await worker.take(), [*CALL, cut], reason="length")
    events = sse_events((await task).content)
    (delta,) = [data for name, data in events if name == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["dropped_tool_calls"] == 1
    task = asyncio.create_task(sdk.messages.create(**ask))
    await worker.answer(await worker.take(), [cut.lstrip()], reason="length")
    assert (await task).stop_reason == "max_tokens"  # nothing complete: cut short
