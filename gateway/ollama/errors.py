"""Errors in Ollama's shape, {"error": "message"}, for the Ollama API's paths (/api/...).

The HTTP status stays the one shared/errors.py gives (with Retry-After where it has one). Messages that name an
OpenAI field the request was translated into (gateway/ollama/protocol.py) name the Ollama field the client sent.
"""

from __future__ import annotations

import re
from typing import Any

from shared.errors import LLMFleetError

PATH_PREFIX = "/api/"
_OPENAI_NAMES = [
    (re.compile(r"'response_format(\.json_schema\.schema)?'"), "'format'"),
    (re.compile(r"\bresponse_format(\.json_schema\.schema)?\b"), "format"),
    (re.compile(r"'max_tokens'"), "'options.num_predict'"),
    (re.compile(r"'repetition_penalty'"), "'options.repeat_penalty'"),
    (re.compile(r"'(temperature|top_p|top_k|min_p|seed|presence_penalty|frequency_penalty)'"), r"'options.\1'"),
]


def is_ollama_path(path: str) -> bool:
    """Whether a request path belongs to the Ollama API (its errors take Ollama's shape)."""
    return path.startswith(PATH_PREFIX)


def ollama_message(error: LLMFleetError) -> str:
    """The error's message with the OpenAI field names it may mention rewritten to Ollama's."""
    message = error.message
    for pattern, replacement in _OPENAI_NAMES:
        message = pattern.sub(replacement, message)
    return message


def error_body(error: LLMFleetError) -> dict[str, Any]:
    """Ollama's error body (also a stream's last line when it fails after it began)."""
    return {"error": ollama_message(error)}
