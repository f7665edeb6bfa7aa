"""Issue 42, forced tool calls end as calls, end to end with the unmodified openai and anthropic clients against
SmolLM2 workers: a named function is exactly one call; `required` with parallel_tool_calls left unset is one call
(llama-server's default); Anthropic's `any` and `tool` end with tool_use and a tool_result round trip goes on.
Greedy SmolLM2-135M, allowed parallel calls, repeats its call until max_tokens cuts one (test_tools_api.py)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.integration.test_tools_api import ASK, MODEL, PARAMETERS, RESPONSES_WEATHER, WEATHER

pytestmark = [pytest.mark.slow, pytest.mark.integration]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("choice", [NAMED, "required"])
@pytest.mark.parametrize("max_tokens", [60, 200])
def test_a_forced_choice_is_one_call_that_ends_the_turn(client: openai.OpenAI, choice: Any, max_tokens: int) -> None:
    """parallel_tool_calls unset: the grammar closes after one call, long before the limit (no drop, no header)."""
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                           tool_choice=choice, max_tokens=max_tokens, temperature=0)
    reply = raw.parse()
    choice_ = reply.choices[0]
    (call,) = choice_.message.tool_calls
    assert choice_.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
    assert reply.usage.completion_tokens < max_tokens and "x-llmfleet-dropped-tool-calls" not in raw.headers
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                                 max_tokens=max_tokens, temperature=0, stream=True))
    starts = [part for c in chunks for part in c.choices[0].delta.tool_calls or [] if part.id]
    assert len(starts) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_named_choice_is_one_call_even_with_parallel_calls_allowed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                           parallel_tool_calls=True, max_tokens=200, temperature=0)
    assert len(reply.choices[0].message.tool_calls) == 1 and reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("max_output_tokens", [60, 200])
def test_a_forced_responses_call_completes(client: openai.OpenAI, max_output_tokens: int) -> None:
    """The Agents SDK's path: a forced function call is a `completed` response, streamed or not."""
    kwargs = {"model": MODEL, "input": ASK[0]["content"], "tools": [RESPONSES_WEATHER], "tool_choice": "required",
              "max_output_tokens": max_output_tokens, "temperature": 0}
    response = client.responses.create(**kwargs)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and response.parallel_tool_calls is False
    assert isinstance(json.loads(call.arguments), dict)
    with client.responses.stream(**kwargs) as stream:
        final = stream.get_final_response()  # raises unless the stream ends with response.completed
    assert [(i.name, i.arguments) for i in final.output if i.type == "function_call"] == [(call.name, call.arguments)]


def test_a_parallel_turn_cut_in_a_further_call_is_completed_with_the_drop_shown(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=ASK[0]["content"], tools=[RESPONSES_WEATHER], tool_choice="required",
        parallel_tool_calls=True, max_output_tokens=60, temperature=0)
    response = raw.parse()
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and response.status == "completed" and response.usage.output_tokens == 60
    assert response.usage.dropped_tool_calls == 1 and raw.headers["x-llmfleet-dropped-tool-calls"] == "1"


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_anthropic_forced_tools_end_with_tool_use_and_a_result_round_trips(cluster: Any,
                                                                          tool_choice: dict[str, Any]) -> None:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)
    tool = {"name": "get_weather", "description": "Current weather in a city", "input_schema": PARAMETERS}
    ask = {"model": MODEL, "max_tokens": 60, "tools": [tool], "extra_body": {"temperature": 0}}
    message = client.messages.create(**ask, messages=ASK, tool_choice=tool_choice)
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses and all(u.name == "get_weather" for u in uses)
    if tool_choice["type"] == "tool":
        assert len(uses) == 1
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": '{"temperature": 21}'} for u in uses]
    history = [*ASK, {"role": "assistant", "content": [
        {"type": "tool_use", "id": u.id, "name": u.name, "input": u.input} for u in uses]},
               {"role": "user", "content": results}]
    answer = client.messages.create(**ask, messages=history, tool_choice={"type": "none"})
    assert answer.content and answer.content[0].type == "text" and answer.stop_reason in ("end_turn", "max_tokens")
