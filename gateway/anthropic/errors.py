"""Errors in Anthropic's shape, {"type": "error", "error": {"type", "message"}}, for the Messages API's paths.

The HTTP status stays the one shared/errors.py gives (with Retry-After where it has one); the error type is
Anthropic's name for that status. Messages that name an OpenAI field the request was translated into (a tool's
`function.parameters`, `stop`) are rewritten to the Anthropic field the client sent.
"""

from __future__ import annotations

import re
from typing import Any

from shared.errors import LLMFleetError

PATH_PREFIX = "/v1/messages"
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
_OPENAI_NAMES = [
    (re.compile(r"(tools\[\d+\])\.function\.parameters"), r"\1.input_schema"),
    (re.compile(r"(tools\[\d+\])\.function\."), r"\1."),
    (re.compile(r"'stop'"), "'stop_sequences'"),
    (re.compile(r"'required' needs"), "{\"type\": \"any\"} needs"),
    (re.compile(r"response_format\.json_schema\.schema"), "output_config.format.schema"),
    (re.compile(r"response_format"), "output_config.format"),
]


def is_anthropic_path(path: str) -> bool:
    """Whether a request path belongs to the Messages API (its errors take Anthropic's shape)."""
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in TYPES:
        return TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def anthropic_message(error: LLMFleetError) -> str:
    """The error's message with the OpenAI field names it may mention rewritten to Anthropic's."""
    message = error.message
    for pattern, replacement in _OPENAI_NAMES:
        message = pattern.sub(replacement, message)
    return message


def error_body(error: LLMFleetError) -> dict[str, Any]:
    """The Anthropic error body (also the data of a mid-stream `event: error`)."""
    return {"type": "error", "error": {"type": error_type(error.status), "message": anthropic_message(error)}}
