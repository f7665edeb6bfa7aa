"""gpt-oss's harmony format end to end on real processes (Redis, a gateway, a worker), with the unmodified openai and
ollama clients.

No gpt-oss small enough ships, so the worker serves SmolLM2 with gpt-oss's tokenizer keys (bench/gpt_oss_tokens.py):
its template is gpt-oss's, its special tokens harmony's, and the worker publishes `harmony`. SmolLM2 knows nothing of
harmony and, unconstrained, ends at once (`<|return|>` holds the id of its own end-of-turn token); the grammars
make it write harmony: a forced tool call is a commentary message to functions.get_weather, structured output the
final channel's JSON. So every step here is the real one: the prompt rendered by the gpt-oss template, the markers
generated as their own tokens and detokenized as text, the gateway's harmony parser on each API, collected and
streamed. (The reasoning split on every API, with text a model writes in the analysis channel, is
tests/gateway/replies/test_harmony_routes.py: SmolLM2 never chooses that channel.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmfleet.local_cluster import LocalCluster
from tests.support.cluster import serving_file_as

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "gpt-oss"  # the served name: SmolLM2 with gpt-oss's keys here, the gpt-oss twin in test_gpt_oss_twin_api
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": CITY}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
MARKERS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "to=functions")


@pytest.fixture(scope="module")
def harmony_cluster(gpt_oss_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Redis, a gateway and one worker serving SmolLM2 with gpt-oss's tokenizer and template."""
    with serving_file_as(gpt_oss_gguf_path, MODEL, tmp_path_factory.mktemp("harmony-logs")) as running:
        yield running


@pytest.fixture(scope="module")
def client(harmony_cluster: LocalCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=harmony_cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)


def _clean(*texts: str | None) -> bool:
    return not any(marker in (text or "") for text in texts for marker in MARKERS)


def test_a_forced_call_and_its_round_trip(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=60, temperature=0)
    choice = reply.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"} and _clean(choice.message.content)
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    after = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                           max_tokens=40, temperature=0, response_format=SCHEMA)
    alone = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                           response_format=SCHEMA)
    assert after.choices[0].finish_reason == "stop"
    assert after.usage.prompt_tokens > alone.usage.prompt_tokens + 20  # the call and its result, rendered
    assert set(json.loads(after.choices[0].message.content)) == {"city"}  # the final channel's body, markers gone
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                                 max_tokens=60, temperature=0, stream=True))
    parts = [part for c in chunks if c.choices for part in c.choices[0].delta.tool_calls or []]
    assert parts[0].function.name == "get_weather"
    assert "".join(p.function.arguments or "" for p in parts) == call.function.arguments
    assert _clean(*(c.choices[0].delta.content for c in chunks if c.choices))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_structured_output_is_the_final_channel(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                           response_format=SCHEMA)
    content = reply.choices[0].message.content
    assert set(json.loads(content)) == {"city"} and reply.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, temperature=0, response_format=SCHEMA, stream=True) if c.choices)
    assert streamed == content
    raw = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                         response_format=SCHEMA, extra_body={"reasoning_format": "none"})
    assert raw.choices[0].message.content == content  # no analysis message: nothing else to keep


def test_responses_api_calls_and_formats(client: openai.OpenAI) -> None:
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": CITY}
    response = client.responses.create(model=MODEL, input=ASK[0]["content"], tools=[tool], tool_choice="required",
                                       max_output_tokens=60, temperature=0, reasoning={"effort": "low"})
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    assert response.reasoning.effort == "low"
    answered = client.responses.create(
        model=MODEL, previous_response_id=response.id, max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    assert set(json.loads(answered.output_text)) == {"city"} and _clean(answered.output_text)


def test_ollama_client_gets_a_call_and_a_format(harmony_cluster: LocalCluster) -> None:
    ollama = pytest.importorskip("ollama")
    local = ollama.Client(host=harmony_cluster.base_url, timeout=180)
    options = {"temperature": 0, "num_predict": 60}
    message = local.chat(model=MODEL, messages=ASK, tools=[WEATHER], options=options, think="low").message
    (call,) = message.tool_calls  # tools in auto mode: the grammar holds harmony, SmolLM2 calls
    assert call.function.name == "get_weather" and set(call.function.arguments) == {"city"}
    assert _clean(message.content, message.thinking)
    history = [*ASK, message, {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]
    answer = local.chat(model=MODEL, messages=history, format=CITY, options=options).message
    assert set(json.loads(answer.content)) == {"city"} and not answer.tool_calls
    streamed = "".join(part.message.content for part in local.chat(model=MODEL, messages=ASK, format=CITY,
                                                                    options=options, stream=True))
    assert set(json.loads(streamed)) == {"city"}
