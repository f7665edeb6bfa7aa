"""The Responses API end to end with the unmodified openai SDK: gateway -> Redis -> SmolLM2 workers, and a
second gateway process continuing a conversation the first one stored."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.cluster import start_extra_gateway

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
INSTRUCTIONS = "You are a concise assistant."
ASK = "Name three colours of the rainbow."
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "unit": {"enum": ["celsius", "fahrenheit"]}},
              "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": PARAMETERS, "strict": True}
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                         "country": {"type": "string", "maxLength": 30},
                                         "kind": {"enum": ["capital", "other"]}},
        "required": ["name", "country", "kind"], "additionalProperties": False}


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture()
def second_gateway(cluster: Any, tmp_path: Any) -> Iterator[openai.OpenAI]:
    """Another `llmfleet gateway` process on the same Redis (it shares nothing else with the first)."""
    proc, base = start_extra_gateway(cluster, tmp_path / "gateway2.log", wait_for="/ready")
    try:
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        cluster.stop(proc)


def test_a_greedy_response_equals_the_same_chat(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, max_output_tokens=24,
                                       temperature=0)
    twin = client.chat.completions.create(model=MODEL, max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ASK}])
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == twin.choices[0].message.content and response.output_text
    expected = {"length": "incomplete", "stop": "completed"}[twin.choices[0].finish_reason]
    assert response.status == expected
    assert response.usage.input_tokens == twin.usage.prompt_tokens > 0
    assert response.usage.output_tokens == twin.usage.completion_tokens > 0
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_a_stream_sends_the_typed_events_and_ends_with_the_same_response(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input=ASK, max_output_tokens=24, temperature=0)
    with client.responses.stream(model=MODEL, input=ASK, max_output_tokens=24, temperature=0) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"} and len(kinds) > 10
    last = {"completed": "response.completed", "incomplete": "response.incomplete"}[whole.status]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", last]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert streamed == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens and final.status == whole.status


def test_a_function_call_round_trip_through_a_second_gateway(client: openai.OpenAI,
                                                             second_gateway: openai.OpenAI) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    ask = "What is the weather in Paris right now?"
    first = client.responses.create(model=MODEL, input=ask, tools=[WEATHER], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=80, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C and sunny"}
    second = second_gateway.responses.create(model=MODEL, previous_response_id=first.id, input=[result],
                                             tools=[WEATHER], max_output_tokens=24, temperature=0)
    assert second.previous_response_id == first.id and second.output_text
    # the same conversation sent whole (no stored history) is the same greedy answer
    whole = client.responses.create(model=MODEL, input=[{"role": "user", "content": ask}, call.model_dump(), result],
                                    tools=[WEATHER], max_output_tokens=24, temperature=0, store=False)
    assert whole.output_text == second.output_text
    assert second_gateway.responses.retrieve(second.id).output_text == second.output_text
    # what the second response read, listed by either gateway, and sent again as item references
    listed = list(client.responses.input_items.list(second.id, order="asc", limit=1))
    kinds = [item.type for item in listed]
    assert kinds[0] == "message" and kinds[-2:] == ["function_call", "function_call_output"], kinds
    again = second_gateway.responses.create(model=MODEL, input=[{"type": "item_reference", "id": item.id}
                                                                for item in listed],
                                            tools=[WEATHER], max_output_tokens=24, temperature=0, store=False)
    assert again.output_text == second.output_text


def test_text_format_json_schema_validates(client: openai.OpenAI) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    response = client.responses.create(
        model=MODEL, input="Describe Paris as JSON.", max_output_tokens=120, temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    assert response.status == "completed", response.output_text
    jsonschema.validate(json.loads(response.output_text), CITY)


def test_unknown_previous_response_and_bad_items_are_4xx_in_openais_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_0000000000")
    assert caught.value.body["code"] == "previous_response_not_found"
    assert caught.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL, input=[{"type": "banana"}])  # type: ignore[list-item]
    assert bad.value.body["param"] == "input[0].type"


def test_another_gateway_cancels_a_running_stream(client: openai.OpenAI, second_gateway: openai.OpenAI) -> None:
    events: list[Any] = []

    def consume() -> None:
        with client.responses.stream(model=MODEL, input="Tell me a long story about a lighthouse.",
                                     max_output_tokens=400, temperature=0) as stream:
            events.extend(stream)

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 120
    while sum(e.type == "response.output_text.delta" for e in list(events)) < 3:
        assert thread.is_alive() and time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.05)
    rid = events[0].response.id
    assert second_gateway.responses.cancel(rid).status == "cancelled"
    thread.join(timeout=60)
    assert not thread.is_alive(), "the cancelled stream hung"
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.status == "cancelled"
    assert final.usage.output_tokens < 400
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == streamed
    stored = second_gateway.responses.retrieve(rid)
    assert stored.status == "cancelled" and stored.output_text == streamed
    with pytest.raises(openai.BadRequestError):
        second_gateway.responses.cancel(rid)


def test_a_background_response_is_polled_from_another_gateway(client: openai.OpenAI,
                                                             second_gateway: openai.OpenAI) -> None:
    foreground = client.responses.create(model=MODEL, input=ASK, max_output_tokens=16, temperature=0, store=False)
    started = client.responses.create(model=MODEL, input=ASK, max_output_tokens=16, temperature=0, background=True)
    assert started.status == "in_progress" and started.background
    deadline = time.monotonic() + 120
    while (polled := second_gateway.responses.retrieve(started.id)).status == "in_progress":
        assert time.monotonic() < deadline, "the background response never finished"
        time.sleep(0.2)
    assert polled.status == foreground.status and polled.output_text == foreground.output_text
