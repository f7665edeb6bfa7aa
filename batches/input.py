"""Validate a batch's input JSONL as OpenAI does: one request per line, each checked before the batch starts.

Every line is {"custom_id": str, "method": "POST", "url": one of URLS, "body": {...}}; custom_ids are unique;
at least one line and at most LLMFLEET_MAX_BATCH_LINES; a body no larger than a request body may be
(LLMFLEET_MAX_BODY_BYTES). A violation is a 400 that names the line. Whether a body is a valid request
for its model is decided when the line runs: a bad body fails that line only (it goes to the error file).
Unlike OpenAI, lines may target different endpoints of the three (a batch's `endpoint` is its main one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.http.fields import lone_surrogate_path
from shared.errors import InvalidRequest

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch: its position in the input file, custom_id, endpoint and body."""

    index: int
    custom_id: str
    url: str
    body: dict[str, Any]


def _line_error(number: int, message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(f"Line {number} of the input file: {message}", param=param)


def parse_input(data: bytes, *, max_lines: int, max_body_bytes: int) -> list[BatchLine]:
    """Every request of a batch input file, in order; a 400 naming the first bad line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("The input file is not UTF-8 text.", param="input_file_id") from None
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(lines) == max_lines:
            raise InvalidRequest(f"The input file has more than {max_lines} requests.", param="input_file_id")
        line = _parse_line(raw, number, len(lines), max_body_bytes)
        if line.custom_id in seen:
            raise _line_error(number, f"the custom_id {line.custom_id!r} is used by an earlier line; "
                              "custom_ids must be unique.", "custom_id")
        seen.add(line.custom_id)
        lines.append(line)
    if not lines:
        raise InvalidRequest("The input file has no requests.", param="input_file_id")
    return lines


def _parse_line(raw: str, number: int, index: int, max_body_bytes: int) -> BatchLine:
    try:
        item = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise _line_error(number, "not valid JSON.") from None
    if not isinstance(item, dict):
        raise _line_error(number, "expected a JSON object with custom_id, method, url and body.")
    if lone_surrogate_path(item) is not None:
        raise _line_error(number, "contains a lone UTF-16 surrogate, which is not valid Unicode.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _line_error(number, "custom_id must be a non-empty string.", "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID:
        raise _line_error(number, f"custom_id is longer than {MAX_CUSTOM_ID} characters.", "custom_id")
    if item.get("method") != "POST":
        raise _line_error(number, "method must be 'POST'.", "method")
    url = item.get("url")
    if url not in URLS:
        raise _line_error(number, f"url must be one of {', '.join(URLS)}.", "url")
    body = item.get("body")
    if not isinstance(body, dict):
        raise _line_error(number, "body must be a JSON object (the request's body).", "body")
    if len(json.dumps(body).encode()) > max_body_bytes:
        raise _line_error(number, f"the body is larger than the limit of {max_body_bytes} bytes.", "body")
    return BatchLine(index=index, custom_id=custom_id, url=url, body=body)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
