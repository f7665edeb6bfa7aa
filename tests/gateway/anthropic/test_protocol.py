"""Anthropic Messages requests become the same chat jobs as OpenAI's: system, blocks, tools, tool_choice, limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.anthropic import protocol as anthropic
from gateway.replies import protocol, serving
from shared.errors import InvalidRequest
from shared.messages import ChatMessage, GenerateJob, ToolCall
from shared.settings import Settings

SETTINGS = Settings()
WEATHER = {"name": "get_weather", "description": "The weather now",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def job_of(body: dict[str, Any], **kw: Any) -> GenerateJob:
    request = anthropic.parse_messages({"model": "m", "max_tokens": 32, **body}, SETTINGS, **kw)
    return serving.build_jobs(request, SETTINGS, "req-1", 0.0)[0]


def openai_job(body: dict[str, Any]) -> GenerateJob:
    return serving.build_jobs(protocol.parse_chat({"model": "m", **body}, SETTINGS), SETTINGS, "req-1", 0.0)[0]


def refused(body: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(InvalidRequest) as caught:
        anthropic.parse_messages({"model": "m", **body}, SETTINGS, **kw)
    assert caught.value.status == 400
    return caught.value.message


def test_a_plain_request_is_the_same_job_as_the_same_chat_through_openai() -> None:
    body = {"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "stop_sequences": ["\n\n", "END"], "metadata": {"user_id": "u1"}}
    job = job_of(body)
    twin = openai_job({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                       "max_tokens": 32, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop": ["\n\n", "END"]})
    assert job.messages == twin.messages
    assert (job.max_tokens, job.stop, job.tools, job.tool_choice) == (twin.max_tokens, twin.stop, [], "none")
    assert job.sampling.temperature == 0.5 and job.sampling.top_p == 0.9 and job.sampling.top_k == 40


def test_system_and_content_blocks_join_their_text() -> None:
    job = job_of({"system": [{"type": "text", "text": "A.", "cache_control": {"type": "ephemeral"}},
                             {"type": "text", "text": "B."}],
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "What is"},
                                                            {"type": "text", "text": "the answer?"}]}]})
    assert job.messages == [ChatMessage(role="system", content="A.\nB."),
                            ChatMessage(role="user", content="What is\nthe answer?")]


def test_tool_use_and_tool_results_become_calls_and_tool_turns_in_block_order() -> None:
    job = job_of({"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "two calls", "signature": "x"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no station"}]},
            {"type": "text", "text": "And tomorrow?"}]}]})
    assert job.messages == [
        ChatMessage(role="user", content="Weather in Paris and Rome?"),
        ChatMessage(role="assistant", content="Checking.", tool_calls=[
            ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}'),
            ToolCall(id="toolu_2", name="get_weather", arguments='{"city": "Rome"}')],
            reasoning="two calls"),  # the thinking block goes back (a harmony template renders it)
        ChatMessage(role="tool", content="21 C", tool_call_id="toolu_1"),
        ChatMessage(role="tool", content="Error: no station", tool_call_id="toolu_2"),
        ChatMessage(role="user", content="And tomorrow?"),
    ]
    (spec,) = job.tools
    assert spec.name == "get_weather" and spec.description == "The weather now"
    assert json.loads(spec.parameters) == WEATHER["input_schema"]
    assert job.tool_choice == "auto"


@pytest.mark.parametrize(("choice", "expected", "name", "parallel"), [
    ({"type": "auto"}, "auto", None, True),
    ({"type": "any"}, "required", None, True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", None, False),
    ({"type": "tool", "name": "get_weather"}, "named", "get_weather", False),  # a named tool is one call
    ({"type": "none"}, "none", None, True),
])
def test_tool_choice_maps_onto_openai_choices(choice: dict[str, Any], expected: str, name: str | None,
                                              parallel: bool) -> None:
    job = job_of({"tools": [WEATHER], "tool_choice": choice, "messages": [{"role": "user", "content": "?"}]})
    assert (job.tool_choice, job.tool_name, job.parallel_tool_calls) == (expected, name, parallel)


def test_output_config_format_is_the_same_constraint_as_openais_response_format() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    job = job_of({"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
                  "messages": [{"role": "user", "content": "x"}]})
    twin = openai_job({"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}})
    assert job.constraint == twin.constraint and job.constraint is not None
    assert json.loads(job.constraint.source) == schema


def test_count_tokens_needs_no_max_tokens_and_generates_nothing() -> None:
    request = anthropic.parse_messages({"model": "m", "messages": [{"role": "user", "content": "Hello"}],
                                        "tools": [WEATHER]}, SETTINGS, count_only=True)
    job = serving.build_jobs(request, SETTINGS, "req-1", 0.0)[0]
    assert job.max_tokens == 0 and not job.stream and job.tools[0].name == "get_weather"


@pytest.mark.parametrize(("body", "words"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens: Field required"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "'max_tokens'"),
    ({"max_tokens": 8}, "messages: Field required"),
    ({"max_tokens": 8, "messages": []}, "non-empty"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}]}]},
     "image blocks are not supported"),
    ({"max_tokens": 8, "system": [{"type": "document", "source": {}}], "messages": [{"role": "user", "content": "x"}]},
     "document blocks are not supported"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The"}]},
     "prefill"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                  "input": {}}]}]}, "messages[0].content[0].type"),
    ({"max_tokens": 8, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]}, "'temperature'"),
    ({"max_tokens": 8, "stop_sequences": "END", "messages": [{"role": "user", "content": "x"}]}, "'stop_sequences'"),
    ({"max_tokens": 8, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
      "messages": [{"role": "user", "content": "x"}]}, "server tools"),
    ({"max_tokens": 8, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "x"}]},
     "tools[0].input_schema: Field required"),
    ({"max_tokens": 8, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"},
      "messages": [{"role": "user", "content": "x"}]}, "'other'"),
    ({"max_tokens": 8, "output_config": {"format": {"type": "text"}}, "messages": [{"role": "user", "content": "x"}]},
     "output_config.format"),
    ({"max_tokens": 8, "tool_choice": {"type": "sometimes"}, "messages": [{"role": "user", "content": "x"}]},
     "tool_choice.type"),
])
def test_bad_input_is_a_400_that_names_the_field(body: dict[str, Any], words: str) -> None:
    assert words in refused(body)
