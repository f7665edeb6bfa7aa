"""The Anthropic Messages API end to end with the unmodified anthropic SDK: gateway -> Redis -> SmolLM2 workers."""

from __future__ import annotations

from typing import Any

import openai
import pytest

anthropic = pytest.importorskip("anthropic")
pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
SYSTEM = "You are a concise assistant."
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
INPUT_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": INPUT_SCHEMA}
GREEDY = {"temperature": 0}  # the SDK no longer has sampling arguments; older clients send it, the gateway reads it
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture()
def client(cluster: Any) -> Any:
    return anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture()
def openai_client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat_twin(openai_client: openai.OpenAI) -> Any:
    """The same greedy chat through /v1/chat/completions."""
    return openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": SYSTEM}, *ASK], max_tokens=24, temperature=0)


def test_a_greedy_message_equals_the_same_chat_through_openai(client: Any, openai_client: openai.OpenAI) -> None:
    message = client.messages.create(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=24, extra_body=GREEDY)
    twin = _chat_twin(openai_client)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    (block,) = message.content
    assert block.type == "text" and block.text == twin.choices[0].message.content and block.text
    expected = {"length": "max_tokens", "stop": "end_turn"}[twin.choices[0].finish_reason]
    assert message.stop_reason == expected and message.stop_sequence is None
    usage = message.usage  # input_tokens are the prompt tokens computed, cache reads those the prefix cache served
    assert usage.input_tokens + usage.cache_read_input_tokens == twin.usage.prompt_tokens > 0
    assert message.usage.output_tokens == twin.usage.completion_tokens > 0


def test_a_stream_accumulates_to_the_same_message_in_anthropics_event_order(client: Any, cluster: Any) -> None:
    import httpx

    whole = client.messages.create(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=24, extra_body=GREEDY)
    with client.messages.stream(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=24, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type != "text"]  # "text" is the SDK's own convenience event
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert set(kinds[2:-3]) == {"content_block_delta"} and len(kinds) > 5
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert streamed == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == prompt
    assert final.usage.output_tokens == whole.usage.output_tokens
    body = {"model": MODEL, "system": SYSTEM, "messages": ASK, "max_tokens": 24, "stream": True, **GREEDY}
    raw = httpx.post(cluster.base_url + "/v1/messages", json=body, timeout=120).text  # the SDK hides pings
    names = [line.removeprefix("event: ") for line in raw.split("\n") if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"] and names.count("ping") == 1
    assert names[3:] == [k for k in kinds[2:]]


def test_a_stop_sequence_ends_the_message_and_is_named(client: Any) -> None:
    free = client.messages.create(model=MODEL, messages=ASK, max_tokens=24, extra_body=GREEDY).content[0].text
    words = free.split()
    assert len(words) >= 3, free
    stop = words[2]
    message = client.messages.create(model=MODEL, messages=ASK, max_tokens=24, extra_body=GREEDY, stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == free[:free.index(stop)]


def test_tool_choice_any_makes_a_tool_use_whose_input_validates(client: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    message = client.messages.create(model=MODEL, messages=WEATHER_ASK, tools=[WEATHER], max_tokens=80,
                                     extra_body=GREEDY, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert message.stop_reason == "tool_use"
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, INPUT_SCHEMA)

    with client.messages.stream(model=MODEL, messages=WEATHER_ASK, tools=[WEATHER], max_tokens=80, extra_body=GREEDY,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == \
        [(b.type, getattr(b, "input", None)) for b in message.content]


def test_a_conversation_with_a_tool_result_continues(client: Any) -> None:
    history = [*WEATHER_ASK,
               {"role": "assistant", "content": [
                   {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                    "input": {"city": "Paris", "unit": "celsius"}}]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C and sunny"}]}]
    message = client.messages.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=40, extra_body=GREEDY,
                                     tool_choice={"type": "none"})
    (block,) = message.content
    assert block.type == "text" and block.text and "<tool_call" not in block.text
    assert message.stop_reason in ("end_turn", "max_tokens")


def test_count_tokens_equals_the_input_tokens_of_the_same_message(client: Any) -> None:
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    message = client.messages.create(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=1, extra_body=GREEDY)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens > 0
    with_tools = client.messages.count_tokens(model=MODEL, messages=WEATHER_ASK, tools=[WEATHER])
    without = client.messages.count_tokens(model=MODEL, messages=WEATHER_ASK)
    assert with_tools.input_tokens > without.input_tokens  # the tools are rendered into the prompt


def test_bad_input_is_an_anthropic_shaped_400(client: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:
        client.post("/v1/messages", body={"model": MODEL, "messages": ASK}, cast_to=object)
    assert missing.value.status_code == 400 and "max_tokens" in missing.value.message
    assert missing.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                             "message": missing.value.body["error"]["message"]}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=8, messages=[
            {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "image blocks are not supported" in refused.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
    assert unknown.value.body["error"]["type"] == "not_found_error"


def test_structured_output_through_the_sdks_parse(client: Any) -> None:
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        country: str

    message = client.messages.parse(model=MODEL, max_tokens=60, output_format=City, extra_body=GREEDY,
                                    messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    assert message.stop_reason == "end_turn"
    city = message.parsed_output
    assert isinstance(city, City) and city.name
