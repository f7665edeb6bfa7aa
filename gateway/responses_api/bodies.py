"""Responses API bodies: the response object, its output items (message, function_call) and usage."""

from __future__ import annotations

import json
from typing import Any

from gateway.responses_api.items import item_id
from gateway.responses_api.protocol import ResponsesRequest
from shared.errors import LLMFleetError
from shared.messages import Usage

ZERO_USAGE = Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)


def response_id(request_id: str) -> str:
    """The response id of a request: 'resp_' and its hex digits."""
    return "resp_" + request_id.removeprefix("req-")


def usage_body(usage: Usage, dropped_tool_calls: int = 0) -> dict[str, Any]:
    """OpenAI's Responses usage: prompt tokens (those the prefix cache served as cached_tokens) and output; with
    llmfleet's dropped_tool_calls when a function call cut short by max_output_tokens was left out."""
    body: dict[str, Any] = {
        "input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens}
    if dropped_tool_calls:
        body["dropped_tool_calls"] = dropped_tool_calls
    return body


def status_of(finish_reason: str | None) -> str:
    """A response's status for how its choice ended (a tool turn cut only in a further call is "tool_calls":
    completed)."""
    return {"length": "incomplete", "cancelled": "cancelled"}.get(finish_reason or "", "completed")


def text_part(text: str) -> dict[str, Any]:
    """An output_text content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """An assistant message output item (no content while it is in progress)."""
    content = [] if text is None else [text_part(text)]
    return {"id": item, "type": "message", "status": status, "role": "assistant", "content": content}


def call_item(item: str, call: dict[str, str], status: str = "completed") -> dict[str, Any]:
    """A function_call output item from a parsed tool call {"id", "name", "arguments"}."""
    return {"id": item, "type": "function_call", "status": status, "call_id": call["id"], "name": call["name"],
            "arguments": call["arguments"]}


def reasoning_item(item: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """A reasoning output item: the reply's thinking block as reasoning_text content (none while in progress)."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item, "type": "reasoning", "status": status, "summary": [], "content": content}


def is_complete_call(arguments: str) -> bool:
    """Whether a call's arguments are a whole JSON object (a call cut short by max_output_tokens is not)."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def output_items(text: str | None, calls: list[dict[str, str]], finish_reason: str | None,
                 reasoning: str | None = None, *, rid: str) -> list[dict[str, Any]]:
    """The output of a finished reply of response `rid`: its thinking as a reasoning item, its text as a
    message, then its complete calls."""
    status = "incomplete" if finish_reason == "length" else "completed"
    items = [reasoning_item(item_id("rs", rid), reasoning)] if reasoning else []
    if text or not calls:
        items.append(message_item(item_id("msg", rid), text or "", status))
    items += [call_item(item_id("fc", rid), call) for call in calls if is_complete_call(call["arguments"])]
    return items


def response_body(request: ResponsesRequest, rid: str, created: float, *, status: str,
                  output: list[dict[str, Any]] | None = None, usage: Usage | None = None,
                  error: LLMFleetError | None = None, dropped_tool_calls: int = 0) -> dict[str, Any]:
    """The response object, echoing the request's settings."""
    sampling = request.chat_fields
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": status,
        "background": request.background,
        "error": None if error is None else {"code": error.code or error.type, "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata,
        "model": request.model,
        "output": output or [],
        "parallel_tool_calls": parallel_tool_calls(request),
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": sampling.get("reasoning_effort"), "summary": None},
        "store": request.store,
        "temperature": sampling.get("temperature", 1.0),
        "text": {"format": request.text_format, "verbosity": "medium"},
        "tool_choice": request.tool_choice,
        "tools": request.tools,
        "top_p": sampling.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None if usage is None else usage_body(usage, dropped_tool_calls),
        "user": None,
    }


def parallel_tool_calls(request: ResponsesRequest) -> bool:
    """The parallel_tool_calls the response ran with: as sent, else false where a call is forced (required or a
    named function, as gateway/replies/tools.py defaults it); a named function is always one call."""
    if isinstance(request.tool_choice, dict):
        return False
    sent = request.chat_fields.get("parallel_tool_calls")
    return sent if isinstance(sent, bool) else request.tool_choice != "required"


def deleted_body(rid: str) -> dict[str, Any]:
    """The answer to DELETE /v1/responses/{id}."""
    return {"id": rid, "object": "response", "deleted": True}


def error_event(error: LLMFleetError, sequence_number: int) -> dict[str, Any]:
    """The stream's `error` event."""
    return {"type": "error", "code": error.code or error.type, "message": error.message, "param": error.param,
            "sequence_number": sequence_number}
