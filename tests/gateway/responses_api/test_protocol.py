"""Responses API bodies become the same chat jobs as OpenAI chat completions: input items, instructions, tools,
tool_choice, text.format and the sampling fields; bad input is a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.replies import protocol, serving
from gateway.responses_api.protocol import chat_request, parse_request
from shared.errors import InvalidRequest
from shared.messages import ChatMessage, GenerateJob, ToolCall
from shared.settings import Settings

SETTINGS = Settings()
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather now", "parameters": PARAMETERS}


def job_of(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> GenerateJob:
    request = parse_request({"model": "m", **body}, SETTINGS)
    return serving.build_jobs(chat_request(request, history or [], SETTINGS), SETTINGS, "req-1", 0.0)[0]


def chat_job(body: dict[str, Any]) -> GenerateJob:
    return serving.build_jobs(protocol.parse_chat({"model": "m", **body}, SETTINGS), SETTINGS, "req-1", 0.0)[0]


def refused(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        job_of(body)
    assert caught.value.status == 400
    return caught.value


def test_a_string_input_with_instructions_is_the_same_job_as_the_chat() -> None:
    job = job_of({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 32, "temperature": 0.5,
                  "top_p": 0.9, "seed": 7, "top_k": 40, "metadata": {"run": "1"}})
    twin = chat_job({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                     "max_tokens": 32, "temperature": 0.5, "top_p": 0.9, "seed": 7, "top_k": 40})
    assert job.messages == twin.messages
    assert (job.max_tokens, job.sampling, job.tools, job.tool_choice) == (32, twin.sampling, [], "none")
    switched = job_of({"input": "Hi", "max_output_tokens": 32, "chat_template_kwargs": {"enable_thinking": True},
                       "thinking_budget_tokens": 8})
    assert (switched.template_kwargs, switched.thinking_budget) == ({"enable_thinking": True}, 8)


def test_items_become_messages_with_calls_joined_to_their_assistant_turn() -> None:
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                                        {"type": "input_text", "text": "Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "18 C"}]},
    ]
    job = job_of({"input": items, "tools": [WEATHER]})
    assert job.messages == [
        ChatMessage(role="developer", content="Use tools."),
        ChatMessage(role="user", content="Weather in\nParis?"),
        ChatMessage(role="assistant", content="Checking.", tool_calls=[
            ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
            ToolCall(id="call_2", name="get_weather", arguments='{"city": "Rome"}')]),
        ChatMessage(role="tool", content="21 C", tool_call_id="call_1"),
        ChatMessage(role="tool", content="18 C", tool_call_id="call_2"),
    ]
    (spec,) = job.tools
    assert (spec.name, spec.description, json.loads(spec.parameters)) == ("get_weather", "The weather now", PARAMETERS)
    assert job.tool_choice == "auto"


def test_reasoning_items_go_back_as_their_turns_reasoning() -> None:
    """As llama-server maps them: a reasoning item opens the assistant turn its call or answer joins (a harmony
    template renders it before the call); its summary serves when it has no content; an encrypted one is dropped."""
    thought = {"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "Call it."}]}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}
    summary = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Say it."}]}
    job = job_of({"tools": [WEATHER], "input": [
        {"role": "user", "content": "Weather?"}, thought, call,
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}, summary, answer,
        {"type": "reasoning", "summary": [], "encrypted_content": "..."}, {"role": "user", "content": "Thanks"}]})
    assert job.messages == [
        ChatMessage(role="user", content="Weather?"),
        ChatMessage(role="assistant", content="", reasoning="Call it.", tool_calls=[
            ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')]),
        ChatMessage(role="tool", content="sunny", tool_call_id="call_1"),
        ChatMessage(role="assistant", content="Sunny.", reasoning="Say it."),
        ChatMessage(role="user", content="Thanks"),
    ]


def test_a_call_without_text_before_it_opens_an_assistant_turn() -> None:
    job = job_of({"input": [{"role": "user", "content": "Weather?"},
                            {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"}],
                  "tools": [WEATHER]})
    assert job.messages[1] == ChatMessage(role="assistant", content="",
                                          tool_calls=[ToolCall(id="c", name="get_weather", arguments="{}")])


def test_history_comes_before_the_new_input_and_instructions_before_both() -> None:
    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]}]
    job = job_of({"input": "Again", "instructions": "Be kind."}, history)
    assert [(m.role, m.content) for m in job.messages] == [
        ("system", "Be kind."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Again")]


@pytest.mark.parametrize(("choice", "expected", "name"), [
    ("auto", "auto", None), ("required", "required", None), ("none", "none", None),
    ({"type": "function", "name": "get_weather"}, "named", "get_weather")])
def test_tool_choice_maps_onto_the_chat_choices(choice: Any, expected: str, name: str | None) -> None:
    job = job_of({"input": "Weather?", "tools": [WEATHER], "tool_choice": choice, "parallel_tool_calls": False})
    assert (job.tool_choice, job.tool_name, job.parallel_tool_calls) == (expected, name, False)


def test_text_format_is_the_same_constraint_as_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    job = job_of({"input": "x", "text": {"format": {"type": "json_schema", "name": "out", "schema": schema,
                                                    "strict": True}}})
    twin = chat_job({"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}})
    assert job.constraint is not None and twin.constraint is not None
    assert (job.constraint.kind, job.constraint.source, job.constraint.strict) == (
        twin.constraint.kind, twin.constraint.source, twin.constraint.strict)
    assert job.constraint.param == "text.format.schema"
    assert job_of({"input": "x", "text": {"format": {"type": "json_object"}}}).constraint.kind == "json_schema"
    assert job_of({"input": "x", "text": {"format": {"type": "text"}}}).constraint is None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_text_format_beside_a_forced_call_is_accepted_and_left_unapplied(choice: Any) -> None:
    """instructor's RESPONSES_TOOLS mode sends text.format with the forced tool's schema: the reply is the call,
    held to the tool's own schema, so the format governs nothing (OpenAI accepts the pair)."""
    body = {"input": "x", "tools": [WEATHER], "tool_choice": choice,
            "text": {"format": {"type": "json_schema", "name": "Weather", "schema": PARAMETERS, "strict": True}}}
    job = job_of(body)
    assert job.constraint is None and job.tool_choice in ("required", "named")
    assert "'required' or a named function" in refused({**body, "tool_choice": "auto"}).message


@pytest.mark.parametrize(("body", "param", "words"), [
    ({}, "input", "Missing required parameter"),
    ({"input": []}, "input", "non-empty"),
    ({"input": [{"type": "banana"}]}, "input[0].type", "unknown item type"),
    ({"input": [{"type": "computer_call", "id": "cu_1"}]}, "input[0].type", "not supported"),
    ({"input": [{"type": "item_reference"}]}, "input[0].id", "item id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "text only"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "expected one of"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", "string"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
    ({"input": "x", "tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name", "letters"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "at least one tool"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice", "nope"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type", "json_schema"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name", "name"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "o", "schema": []}}}, "text.format.schema",
     "schema"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "out of range"),
    ({"input": "x", "temperature": 3}, "temperature", "out of range"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata.k", "values strings"),
    ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata", "at most 16"),
    ({"input": "x", "previous_response_id": "chatcmpl-1"}, "previous_response_id", "resp_"),
    ({"input": "x", "store": False, "background": True}, "store", "must be stored"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": "x", "tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format", "tools"),
])
def test_bad_input_is_a_400_that_names_the_field(body: dict[str, Any], param: str, words: str) -> None:
    error = refused(body)
    assert error.param == param and words in error.message, (error.param, error.message)
