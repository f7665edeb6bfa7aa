"""Tool calling end to end with the unmodified openai client: gateway -> Redis -> SmolLM2 workers."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "unit": {"enum": ["celsius", "fahrenheit"]}},
              "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": PARAMETERS}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_required_makes_a_valid_call(client: openai.OpenAI) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    # one call: with parallel calls allowed, SmolLM2-135M (greedy) repeats the same call until max_tokens
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=80, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)


def test_streamed_tool_call_deltas_reassemble_to_the_collected_reply(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=named,
                                           parallel_tool_calls=False, max_tokens=80, temperature=0).choices[0]
    calls: dict[int, list[str]] = {}
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=named,
                                                 parallel_tool_calls=False, max_tokens=80, temperature=0, stream=True))
    for chunk in chunks:
        delta = chunk.choices[0].delta
        assert not delta.content  # only calls: no text, and never a piece of a <tool_call> tag
        for part in delta.tool_calls or []:
            if part.id:
                calls[part.index] = [part.function.name, part.function.arguments or ""]
            else:
                calls[part.index][1] += part.function.arguments
    assert [tuple(v) for _, v in sorted(calls.items())] == [(c.function.name, c.function.arguments)
                                                             for c in whole.message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"


def test_auto_on_a_prompt_that_needs_no_tool_answers_in_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello to Ada in one short sentence."}],
        tools=[WEATHER], max_tokens=40, temperature=0)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert "<tool_call" not in choice.message.content and choice.finish_reason in ("stop", "length")


def test_a_conversation_with_a_tool_result_continues(client: openai.OpenAI) -> None:
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "sunny"}'}]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                           max_tokens=40, temperature=0)
    choice = reply.choices[0]
    assert choice.message.content and choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize("max_tokens", [20, 40, 60, 120])
def test_every_returned_call_parses_whatever_max_tokens_cuts(client: openai.OpenAI, max_tokens: int) -> None:
    """Issue 23: a required call cut short by max_tokens is not returned; its complete predecessors are. Issue 42:
    with a complete call, the cut one is counted (usage.dropped_tool_calls) and the turn ends as "tool_calls";
    with none, finish_reason stays "length". Parallel calls allowed: SmolLM2 repeats its call until max_tokens
    cuts one."""
    ask = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
           "parallel_tool_calls": True, "max_tokens": max_tokens, "temperature": 0}
    raw = client.chat.completions.with_raw_response.create(**ask)
    reply = raw.parse()
    choice = reply.choices[0]
    for call in choice.message.tool_calls or []:
        assert isinstance(json.loads(call.function.arguments), dict), call.function.arguments
    assert choice.finish_reason == ("tool_calls" if choice.message.tool_calls else "length")
    dropped = getattr(reply.usage, "dropped_tool_calls", None)
    assert raw.headers.get("x-llmfleet-dropped-tool-calls") == (None if dropped is None else str(dropped))
    assert dropped in (None, 1)  # at most the one call the limit cut (none when it cut a closing tag)
    streamed: dict[int, list[str]] = {}
    last = None
    for chunk in client.chat.completions.create(**ask, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        for part in (delta.tool_calls if delta else None) or []:
            if part.id:
                streamed[part.index] = [part.function.name, part.function.arguments or ""]
            else:
                streamed[part.index][1] += part.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            last = chunk.choices[0].finish_reason
    for _name, arguments in streamed.values():
        assert isinstance(json.loads(arguments), dict), arguments
    assert [tuple(v) for _, v in sorted(streamed.items())] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert last == choice.finish_reason


def test_anthropic_tool_use_inputs_are_whole_when_max_tokens_cuts(cluster: Any) -> None:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)
    tool = {"name": "get_weather", "description": "Current weather in a city", "input_schema": PARAMETERS}
    kwargs = {"model": MODEL, "max_tokens": 60, "messages": ASK, "tools": [tool], "tool_choice": {"type": "any"},
              "extra_body": {"temperature": 0}}  # the SDK has no sampling arguments; the gateway reads it
    message = client.messages.create(**kwargs)
    uses = [block for block in message.content if block.type == "tool_use"]
    assert all(isinstance(u.input, dict) and u.input for u in uses)
    assert message.stop_reason == ("tool_use" if uses else "max_tokens")  # issue 42: a further call cut: tool_use
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()  # the SDK parses each block's input_json_delta pieces as JSON
    assert [u.input for u in final.content if u.type == "tool_use"] == [u.input for u in uses]


CUTS = [20, 40, 60, 120]
RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                     "parameters": PARAMETERS, "strict": True}


@pytest.mark.parametrize("max_tokens", CUTS)
def test_every_responses_function_call_parses_whatever_max_output_tokens_cuts(client: openai.OpenAI,
                                                                             max_tokens: int) -> None:
    """The Responses API's path: a call cut short is not an output item (the response is "incomplete" when
    max_output_tokens cut it and no call is whole, else a "completed" tool turn); the stream's function_call items
    are the same whole calls."""
    kwargs = {"model": MODEL, "input": ASK[0]["content"], "tools": [RESPONSES_WEATHER], "tool_choice": "required",
              "parallel_tool_calls": True, "max_output_tokens": max_tokens, "temperature": 0}
    response = client.responses.create(**kwargs)
    calls = [(item.name, item.arguments) for item in response.output if item.type == "function_call"]
    for _name, arguments in calls:
        assert isinstance(json.loads(arguments), dict), arguments
    assert response.status == ("completed" if calls else "incomplete")
    if response.usage.output_tokens >= max_tokens and not calls:
        assert response.incomplete_details.reason == "max_output_tokens"
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
    done = [(event.name, event.arguments) for event in events if event.type == "response.function_call_arguments.done"]
    # a response cut by max_output_tokens ends with `response.incomplete` (as OpenAI's does), where the SDK's
    # get_final_response() expects `response.completed`: the last event carries the final response either way
    assert events[-1].type == {"completed": "response.completed", "incomplete": "response.incomplete"}[response.status]
    final = events[-1].response
    assert done == calls == [(item.name, item.arguments) for item in final.output if item.type == "function_call"]


def test_batch_tool_calls_parse_whatever_max_tokens_cuts(cluster: Any, client: openai.OpenAI, tmp_path: Any) -> None:
    """The batch API's path: each line's calls parse, and equal the same request made directly."""
    from tests.support.batches import start_batch_runner

    bodies = {f"cut-{n}": {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                           "max_tokens": n, "temperature": 0} for n in CUTS}
    data = "".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
                   + "\n" for cid, body in bodies.items()).encode()
    runner = start_batch_runner(cluster, tmp_path / "batch-runner.log")
    try:
        file_id = client.files.create(file=("tools.jsonl", data), purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        deadline = time.monotonic() + 400
        while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired"):
            assert time.monotonic() < deadline, batch.request_counts
            time.sleep(0.5)
    finally:
        cluster.stop(runner)
    assert batch.status == "completed" and batch.output_file_id and not batch.error_file_id, batch
    lines = {line["custom_id"]: line for line in map(json.loads,
                                                     client.files.content(batch.output_file_id).text.splitlines())}
    assert set(lines) == set(bodies)
    for cid, body in bodies.items():
        message = lines[cid]["response"]["body"]["choices"][0]["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
        for _name, arguments in calls:
            assert isinstance(json.loads(arguments), dict), arguments
        twin = client.chat.completions.create(**body).choices[0].message
        assert calls == [(c.function.name, c.function.arguments) for c in twin.tool_calls or []], cid
