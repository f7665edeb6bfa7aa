"""Anthropic's error shape: types by status, and messages that name the fields the client sent."""

from __future__ import annotations

import pytest

from gateway.anthropic import protocol as anthropic
from gateway.anthropic.errors import anthropic_message, error_body, error_type, is_anthropic_path
from shared.errors import (
    AuthenticationFailed,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    NoWorkerAvailable,
    QueueFull,
)
from shared.settings import Settings


@pytest.mark.parametrize(("error", "kind"), [
    (InvalidRequest("x"), "invalid_request_error"),
    (AuthenticationFailed("x"), "authentication_error"),
    (ModelNotFound("x"), "not_found_error"),
    (QueueFull("x", retry_after=1), "rate_limit_error"),
    (InternalError("x"), "api_error"),
    (NoWorkerAvailable("x", retry_after=1), "overloaded_error"),
    (DeadlineExceeded("x"), "timeout_error"),
])
def test_each_status_has_anthropics_type(error, kind: str) -> None:
    assert error_body(error) == {"type": "error", "error": {"type": kind, "message": "x"}}


def test_unlisted_statuses_fall_back_by_class() -> None:
    assert (error_type(418), error_type(502)) == ("invalid_request_error", "api_error")


def test_messages_name_the_anthropic_fields() -> None:
    with pytest.raises(InvalidRequest) as caught:
        anthropic.parse_messages({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
                                  "tools": [{"name": "no spaces allowed", "input_schema": {}}]}, Settings())
    assert "tools[0].function.name" in caught.value.message
    assert "'tools[0].name'" in anthropic_message(caught.value)
    compiled = InvalidRequest("tools[1].function.parameters: unsupported keyword", param="tools[1].function.parameters")
    assert anthropic_message(compiled) == "tools[1].input_schema: unsupported keyword"


def test_tool_choice_any_without_tools_is_named_as_sent() -> None:
    with pytest.raises(InvalidRequest) as caught:
        anthropic.parse_messages({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
                                  "tool_choice": {"type": "any"}}, Settings())
    assert anthropic_message(caught.value) == "Invalid value for 'tool_choice': {\"type\": \"any\"} needs at least one tool in tools."


def test_only_the_messages_paths_are_anthropics() -> None:
    assert is_anthropic_path("/v1/messages") and is_anthropic_path("/v1/messages/count_tokens")
    assert not is_anthropic_path("/v1/messagesx") and not is_anthropic_path("/v1/chat/completions")
