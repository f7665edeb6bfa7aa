"""The Responses API through the unmodified openai SDK against the gateway and a scripted worker: response
objects, the typed event stream in order, function calls, stored responses (GET, DELETE, previous_response_id,
cancel, background) and error shapes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from shared import codec, keys
from shared.errors import ContextLengthExceeded
from shared.messages import ChoiceEndEvent, DoneEvent, Usage
from tests.gateway.test_lifecycle import call_app  # drives the ASGI app and disconnects on cue
from tests.support.sse import split_ids

pytestmark = pytest.mark.anyio
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather now", "parameters": PARAMETERS}
CALL = ['<tool_call>\n{"name": "get_', 'weather", "arguments": {"ci', 'ty": "Pa}ris"}}\n</tool_call>']


@pytest.fixture(autouse=True)
def _request_ids(fixed_request_id: None) -> None:
    """Every test here sees req-0123, req-0124, ... (tests/gateway/conftest.py)."""


@pytest.fixture
def sdk(app_client) -> openai.AsyncOpenAI:
    app, _ = app_client
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway/v1")
    return openai.AsyncOpenAI(api_key="unused", base_url="http://gateway/v1", http_client=http, max_retries=0)


def sse_events(body: bytes) -> list[dict[str, Any]]:
    """The data of every SSE event; asserts each is named after its type and numbered in order."""
    out = []
    ids, blocks = split_ids(body.decode())
    for block in blocks:
        if block.startswith(":"):
            continue
        name_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name_line.removeprefix("event: ")
        out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert ids in ([], [e["sequence_number"] for e in out])  # a resumable stream's ids are its sequence numbers
    return out


async def test_a_response_has_openais_shape_and_is_stored(sdk, worker) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Weather in Paris?", instructions="Brief.",
                                                    max_output_tokens=16, metadata={"run": "7"}))
    job = await worker.take()
    assert job.max_tokens == 16 and [m.role for m in job.messages] == ["system", "user"] and not job.stream
    assert job.id == "req-0123"
    await worker.answer(job, ["Sunny", ", 21 C."])
    response = await task
    assert response.id == "resp_0123" and response.object == "response" and response.status == "completed"
    assert response.output_text == "Sunny, 21 C." and response.output[0].role == "assistant"
    assert response.metadata == {"run": "7"} and response.instructions == "Brief." and response.store
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (3, 2, 5)
    got = await sdk.responses.retrieve(response.id)
    assert got.model_dump() == response.model_dump()
    deleted = await sdk.responses.delete(response.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.responses.retrieve(response.id)
    assert caught.value.body["code"] == "response_not_found"


async def test_cut_short_is_incomplete_and_store_false_is_not_kept(sdk, worker) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Hi", store=False))
    job = await worker.take()
    await worker.answer(job, ["Hel", "lo"], reason="length")
    response = await task
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(response.id)


async def test_a_stream_sends_the_typed_events_in_order(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/responses", json={"model": "smollm2", "input": "Hi", "stream": True}))
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
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert [e["delta"] for e in events[4:6]] == ["Sun", "ny"] and events[6]["text"] == "Sunny"
    item = events[8]["item"]
    assert item["id"] == events[2]["item"]["id"] == events[4]["item_id"] and item["content"][0]["text"] == "Sunny"
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"] == [item]
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 2 and final["usage"]["output_tokens"] == 3
    assert not response.content.endswith(b"data: [DONE]\n\n")


async def test_the_sdk_stream_accumulates_the_same_response(sdk, worker) -> None:
    async def run() -> tuple[list[str], Any]:
        async with sdk.responses.stream(model="smollm2", input="Hi") as stream:
            texts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            return texts, await stream.get_final_response()

    task = asyncio.create_task(run())
    job = await worker.take()
    await worker.answer(job, ["Sun", "ny."])
    texts, final = await task
    assert texts == ["Sun", "ny."] and final.output_text == "Sunny." and final.status == "completed"
    assert (await sdk.responses.retrieve(final.id)).output_text == "Sunny."


async def test_a_function_call_round_trip_continues_the_stored_conversation(sdk, worker) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Weather in Paris?", tools=[WEATHER],
                                                    tool_choice="required"))
    job = await worker.take()
    assert job.tool_choice == "required" and job.tools[0].name == "get_weather"
    await worker.answer(job, ["Checking. ", *CALL])
    first = await task
    text, call = first.output
    assert text.type == "message" and text.content[0].text == "Checking."
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Pa}ris"} and call.call_id.startswith("call_") and call.id.startswith("fc_")
    task = asyncio.create_task(sdk.responses.create(
        model="smollm2", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}]))
    job = await worker.take()
    assert [(m.role, m.content) for m in job.messages] == [
        ("user", "Weather in Paris?"), ("assistant", "Checking."), ("tool", "21 C")]
    assert job.messages[1].tool_calls[0].id == call.call_id and job.messages[2].tool_call_id == call.call_id
    await worker.answer(job, ["It is 21 C."])
    second = await task
    assert second.previous_response_id == first.id and second.output_text == "It is 21 C."


CUT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro'  # a further call cut by max_output_tokens


async def test_a_further_call_cut_short_is_left_out_of_a_completed_turn(sdk, client, worker) -> None:
    """Issue 42: the complete call is a finished tool turn (`completed`, what the Agents SDK expects); the drop
    shows in usage.dropped_tool_calls and, not streamed, the x-llmfleet-dropped-tool-calls header."""
    task = asyncio.create_task(sdk.responses.with_raw_response.create(model="smollm2", input="Weather?",
                                                                      tools=[WEATHER]))
    job = await worker.take()
    await worker.answer(job, [*CALL, CUT], reason="length")
    raw = await task
    response = raw.parse()
    assert response.status == "completed" and response.incomplete_details is None
    assert [o.type for o in response.output] == ["function_call"] and response.output[0].status == "completed"
    assert response.usage.dropped_tool_calls == 1 and raw.headers["x-llmfleet-dropped-tool-calls"] == "1"
    task = asyncio.create_task(client.post("/v1/responses", json={
        "model": "smollm2", "input": "Weather?", "tools": [WEATHER], "stream": True}))
    job = await worker.take()
    await worker.answer(job, [*CALL, CUT], reason="length")
    events = sse_events((await task).content)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta",  # a call is held until it closes, then sent whole
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert json.loads(events[4]["arguments"]) == {"city": "Pa}ris"} and events[4]["name"] == "get_weather"
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["function_call"] and final["status"] == "completed"
    assert final["usage"]["dropped_tool_calls"] == 1


async def test_a_first_call_cut_short_leaves_an_incomplete_response(sdk, client, worker) -> None:
    task = asyncio.create_task(sdk.responses.with_raw_response.create(model="smollm2", input="Weather?",
                                                                      tools=[WEATHER], tool_choice="required"))
    job = await worker.take()
    assert not job.parallel_tool_calls  # unset with a forced choice: one call, as llama-server defaults it
    await worker.answer(job, [CUT], reason="length")
    raw = await task
    response = raw.parse()
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.parallel_tool_calls is False
    assert [o.type for o in response.output] == ["message"] and response.output[0].status == "incomplete"
    assert response.usage.dropped_tool_calls == 1 and raw.headers["x-llmfleet-dropped-tool-calls"] == "1"
    task = asyncio.create_task(client.post("/v1/responses", json={
        "model": "smollm2", "input": "Weather?", "tools": [WEATHER], "stream": True}))
    await worker.answer(await worker.take(), ["Let me look.", CUT], reason="length")
    events = sse_events((await task).content)
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["output"][0]["type"] == "message"


async def test_unknown_previous_response_id_is_a_404_in_openais_shape(client, worker, redis) -> None:
    response = await client.post("/v1/responses", json={"model": "smollm2", "input": "Hi",
                                                        "previous_response_id": "resp_nope"})
    assert response.status_code == 404
    assert response.json() == {"error": {"message": "Previous response with id 'resp_nope' not found.",
                                         "type": "invalid_request_error", "param": "previous_response_id",
                                         "code": "previous_response_not_found"}}


async def test_a_redis_restart_that_lost_the_stored_response_is_a_404(sdk, client, worker, redis) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Hi"))
    job = await worker.take()
    await worker.answer(job, ["Hello"])
    first = await task
    await redis.flushall()  # what a Redis restart without persistence leaves
    await worker.register()
    response = await client.post("/v1/responses", json={"model": "smollm2", "input": "Again",
                                                        "previous_response_id": first.id})
    assert response.status_code == 404 and response.json()["error"]["code"] == "previous_response_not_found"


async def test_an_error_before_the_first_token_is_a_plain_http_error(sdk, worker) -> None:
    async def run() -> None:
        async with sdk.responses.stream(model="smollm2", input="Hi") as stream:
            async for _ in stream:
                pass

    task = asyncio.create_task(run())
    job = await worker.take()
    await worker.send(ContextLengthExceeded("too long", param="messages").to_event(job.id, worker.next_seq(job.id)))
    with pytest.raises(openai.BadRequestError) as caught:
        await task
    assert caught.value.body["code"] == "context_length_exceeded"
    assert (await sdk.responses.retrieve("resp_0123")).status == "failed"


async def test_an_error_after_the_stream_began_is_an_error_event_then_failed(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/responses", json={"model": "smollm2", "input": "Hi", "stream": True}))
    job = await worker.take()
    await worker.token(job, "Sun")
    error = ContextLengthExceeded("ran out of context", param=None).to_event(job.id, worker.next_seq(job.id))
    await worker.send(error)
    events = sse_events((await task).content)
    assert [e["type"] for e in events][-3:] == ["response.output_text.delta", "error", "response.failed"]
    assert events[-2]["code"] == "context_length_exceeded" and events[-2]["message"] == "ran out of context"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"
    assert failed["output"][0]["content"][0]["text"] == "Sun"


async def test_cancel_stops_a_running_response_from_any_request(sdk, client, worker, redis) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Tell a story."))
    job = await worker.take()
    await worker.token(job, "Once")
    cancelled = await client.post("/v1/responses/resp_0123/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert await redis.exists(keys.cancelled_marker(job.model, job.id))
    await worker.send(ChoiceEndEvent(id=job.id, seq=worker.next_seq(job.id), finish_reason="cancelled"))
    await worker.done(job)
    response = await task
    assert response.status == "cancelled" and response.output_text == "Once"
    again = await client.post("/v1/responses/resp_0123/cancel")
    assert again.status_code == 400 and "cancelled" in again.json()["error"]["message"]


async def test_a_background_response_is_polled_until_done(sdk, worker) -> None:
    started = await sdk.responses.create(model="smollm2", input="Hi", background=True)
    assert started.status == "in_progress" and started.background
    job = await worker.take()
    await worker.answer(job, ["Hello"])
    for _ in range(200):
        got = await sdk.responses.retrieve(started.id)
        if got.status != "in_progress":
            break
        await asyncio.sleep(0.01)
    assert got.status == "completed" and got.output_text == "Hello" and got.usage.output_tokens == 1


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/resp_x"),
                                              ("POST", "/v1/responses/resp_x/cancel")])
async def test_unknown_ids_are_404s(client, method: str, path: str) -> None:
    response = await client.request(method, path)
    assert response.status_code == 404 and response.json()["error"]["code"] == "response_not_found"


async def test_bad_input_is_a_400_in_openais_shape(client, worker) -> None:
    response = await client.post("/v1/responses", json={"model": "smollm2", "input": [{"type": "banana"}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input[0].type"
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_leaving_cancels_the_job_and_stores_it_cancelled(app_client, worker, redis,
                                                                        stream: bool) -> None:
    app, _ = app_client
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.cancel_channel("smollm2"))
    leave = asyncio.Event()
    call = asyncio.create_task(call_app(app, "/v1/responses", {"model": "smollm2", "input": "Hi", "stream": stream},
                                        leave))
    job = await worker.take()
    await worker.token(job, "Hel")
    await asyncio.sleep(0.05)
    leave.set()
    await asyncio.wait_for(call, 5)
    notice = None
    for _ in range(200):
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01)
        if message is not None:
            notice = codec.decode(message["data"])
            break
    await pubsub.aclose()
    assert notice is not None and (notice.id, notice.reason) == (job.id, "client_disconnected")
    stored = json.loads(await redis.get(keys.response_key("resp_0123")))["response"]
    assert stored["status"] == "cancelled"
    if stream:
        assert stored["output"][0]["content"][0]["text"] == "Hel"


THINKING = ["<think>", "\nIt is", " sunny.\n</th", "ink>\n\n", "Sunny", "."]


async def test_a_thinking_block_is_a_reasoning_item_collected_and_streamed(sdk, client, worker) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Weather?"))
    await worker.answer(await worker.take(), THINKING)
    response = await task
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "It is sunny."
    assert response.output_text == "Sunny."
    task = asyncio.create_task(client.post("/v1/responses", json={"model": "smollm2", "input": "Hi", "stream": True}))
    await worker.answer(await worker.take(), THINKING)
    events = sse_events((await task).content)
    kinds = [e["type"] for e in events]
    assert kinds[:6] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.reasoning_text.delta", "response.reasoning_text.delta",
                         "response.reasoning_text.done"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "It is sunny."
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Sunny."
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "It is sunny."}]


async def test_input_items_lists_what_the_response_read_page_by_page(sdk, client, worker) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Weather in Paris?", tools=[WEATHER]))
    await worker.answer(await worker.take(), ["Checking. ", *CALL])
    first = await task
    call = first.output[1]
    task = asyncio.create_task(sdk.responses.create(
        model="smollm2", previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"},
               {"role": "user", "content": "And tomorrow?"}]))
    await worker.answer(await worker.take(), ["Rain."])
    second = await task
    listed = [item async for item in sdk.responses.input_items.list(second.id, limit=2)]  # three pages
    kinds = [item.type for item in listed]
    assert kinds == ["message", "function_call_output", "function_call", "message", "message"]  # newest first
    assert listed[2].id == call.id and listed[3].id == first.output[0].id  # an output item keeps its id
    assert listed[4].content[0].text == "Weather in Paris?" and listed[0].content[0].text == "And tomorrow?"
    assert len({item.id for item in listed}) == 5
    oldest = await sdk.responses.input_items.list(second.id, order="asc", limit=1)
    assert [item.id for item in oldest.data] == [listed[4].id] and oldest.has_more
    response = await client.get(f"/v1/responses/{second.id}/input_items", params={"after": "msg_nope"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "after"
    assert (await client.get("/v1/responses/resp_ffff/input_items")).status_code == 404


async def test_an_item_reference_brings_a_stored_item_into_a_new_conversation(sdk, client, worker) -> None:
    task = asyncio.create_task(sdk.responses.create(model="smollm2", input="Weather in Paris?", tools=[WEATHER]))
    await worker.answer(await worker.take(), ["Checking. ", *CALL])
    first = await task
    asked, call = (await sdk.responses.input_items.list(first.id)).data[0], first.output[1]
    task = asyncio.create_task(sdk.responses.create(  # no previous_response_id: the ids name the response
        model="smollm2", input=[{"type": "item_reference", "id": asked.id}, {"type": "item_reference", "id": call.id},
                                {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}]))
    job = await worker.take()
    assert [(m.role, m.content) for m in job.messages] == [
        ("user", "Weather in Paris?"), ("assistant", ""), ("tool", "21 C")]
    assert job.messages[1].tool_calls[0].name == "get_weather"
    await worker.answer(job, ["It is 21 C."])
    assert (await task).output_text == "It is 21 C."
    for wanted in ("msg_nope", first.output[0].id.replace(first.id.removeprefix("resp_"), "ffff", 1)):
        response = await client.post("/v1/responses", json={"model": "smollm2", "input": [
            {"type": "item_reference", "id": wanted}]})
        assert response.status_code == 404 and response.json()["error"]["param"] == "input[0]", response.text
