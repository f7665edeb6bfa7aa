"""Tools in the gateway: requests become job fields, replies become tool_calls (collected or streamed alike),
through the unmodified openai SDK against a fake worker."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from gateway.replies import protocol, serving
from shared.errors import InvalidRequest
from shared.messages import ToolCall
from shared.settings import Settings

pytestmark = pytest.mark.anyio

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
REPLY = ['Sure.', ' <tool', '_call>\n{"name": "get_', 'weather", "arguments": {"ci', 'ty": "Pa}ris"}}\n</tool_call>',
         '\n<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>']


@pytest.fixture
def sdk(app_client) -> openai.AsyncOpenAI:
    app, _ = app_client
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway/v1")
    return openai.AsyncOpenAI(api_key="unused", base_url="http://gateway/v1", http_client=http, max_retries=0)


def test_tools_and_history_ride_in_the_job() -> None:
    body = {"model": "m", "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False, "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "-3C"}]}
    job = serving.build_jobs(protocol.parse_chat(body, Settings()), Settings(), "req-1", 0.0)[0]
    assert (job.tool_choice, job.tool_name, job.parallel_tool_calls) == ("named", "get_weather", False)
    assert [t.name for t in job.tools] == ["get_weather"] and json.loads(job.tools[0].parameters)["required"] == ["city"]
    assert job.messages[1].tool_calls == [ToolCall(id="call_1", name="get_weather", arguments='{"city":"Oslo"}')]
    assert job.messages[2].tool_call_id == "call_1" and job.constraint is None
    assert "tools=1 tool_choice=named" in job.describe()


@pytest.mark.parametrize(("choice", "expected"), [(None, "auto"), ("none", "none"), ("required", "required")])
def test_tool_choice_defaults_to_auto_with_tools(choice: str | None, expected: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    if choice:
        body["tool_choice"] = choice
    assert protocol.parse_chat(body, Settings()).tools.choice == expected


async def test_collected_and_streamed_tool_calls_agree(sdk, worker) -> None:
    task = asyncio.create_task(sdk.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]))
    await worker.answer(await worker.take(), REPLY)
    whole = (await task).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Sure."
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert calls == [("get_weather", '{"city": "Pa}ris"}'), ("get_weather", '{"city": "Rome"}')]
    assert all(c.id.startswith("call_") and c.type == "function" for c in whole.message.tool_calls)

    async def stream() -> list:
        response = await sdk.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER], stream=True)
        return [chunk async for chunk in response]

    task = asyncio.create_task(stream())
    await worker.answer(await worker.take(), REPLY)
    chunks = await task
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Sure."  # no partial <tool_call> tag ever leaked
    assert not any("<" in (d.content or "") for d in deltas)
    streamed: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.tool_calls or []:
            if call.id:  # the first chunk of a call carries its id and name, with empty arguments
                assert call.function.name and call.function.arguments == ""
                streamed[call.index] = [call.function.name, ""]
            else:
                streamed[call.index][1] += call.function.arguments
    assert [tuple(streamed[i]) for i in sorted(streamed)] == calls
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_a_plain_answer_with_tools_is_plain_content(sdk, worker) -> None:
    task = asyncio.create_task(sdk.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER]))
    await worker.answer(await worker.take(), ["Hello", " <b>there</b>"])
    choice = (await task).choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == ("Hello <b>there</b>", None, "stop")


@pytest.mark.parametrize(("choice", "sent", "parallel"), [
    ("auto", None, True), ("required", None, False), ("required", True, True), ("auto", False, False),
    ({"type": "function", "function": {"name": "get_weather"}}, None, False),
    ({"type": "function", "function": {"name": "get_weather"}}, True, False),  # a named function is one call
])
def test_parallel_tool_calls_unset_is_false_where_a_call_is_forced(choice, sent, parallel) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": choice}
    if sent is not None:
        body["parallel_tool_calls"] = sent
    assert protocol.parse_chat(body, Settings()).tools.parallel is parallel


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_response_format_beside_a_forced_call_is_left_unapplied(choice) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER["function"]["parameters"]}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": choice,
            "response_format": fmt}
    assert protocol.parse_chat(body, Settings()).params.constraint is None
    with pytest.raises(InvalidRequest, match="'required' or a named function") as refused:
        protocol.parse_chat({**body, "tool_choice": "auto"}, Settings())
    assert refused.value.param == "response_format"


CUT = '\n<tool_call>{"name": "get_weather", "arguments": {"city": "Ro'  # a further call, cut by max_tokens


async def test_a_turn_cut_only_in_a_further_call_is_a_tool_turn(sdk, worker) -> None:
    """Issue 42: the complete call comes back with finish_reason "tool_calls"; the dropped one is counted in
    usage.dropped_tool_calls and (not streamed) the x-llmfleet-dropped-tool-calls header."""
    ask = {"model": "smollm2", "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER],
           "tool_choice": "required", "parallel_tool_calls": True, "max_tokens": 40}
    task = asyncio.create_task(sdk.chat.completions.with_raw_response.create(**ask))
    await worker.answer(await worker.take(), [*REPLY[1:5], CUT], reason="length")
    raw = await task
    whole = raw.parse()
    assert whole.choices[0].finish_reason == "tool_calls" and len(whole.choices[0].message.tool_calls) == 1
    assert whole.usage.dropped_tool_calls == 1 and raw.headers["x-llmfleet-dropped-tool-calls"] == "1"

    async def stream() -> list:
        response = await sdk.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
        return [chunk async for chunk in response]

    task = asyncio.create_task(stream())
    await worker.answer(await worker.take(), [*REPLY[1:5], CUT], reason="length")
    chunks = await task
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.dropped_tool_calls == 1


async def test_a_first_call_cut_short_stays_length(sdk, worker) -> None:
    task = asyncio.create_task(sdk.chat.completions.with_raw_response.create(
        model="smollm2", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER], tool_choice="required"))
    job = await worker.take()
    assert job.tool_choice == "required" and not job.parallel_tool_calls
    await worker.answer(job, [CUT.lstrip()], reason="length")
    raw = await task
    choice = raw.parse().choices[0]
    assert (choice.finish_reason, choice.message.tool_calls) == ("length", None)
    assert raw.headers["x-llmfleet-dropped-tool-calls"] == "1"
