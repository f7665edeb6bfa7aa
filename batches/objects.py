"""OpenAI's file, batch and list objects, built from what Redis stores (plain dicts, ready for JSON)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from shared.redis_commands import reply_text

ACTIVE_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL_STATUSES = ("completed", "failed", "cancelled", "expired")
TIMESTAMPS = ("created_at", "expires_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
              "expired_at", "cancelling_at", "cancelled_at")
COMPLETION_WINDOW_S = {"24h": 24 * 3600}


def new_file_id() -> str:
    """A fresh file id: 'file-' and 24 hex digits."""
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    """A fresh batch id: 'batch_' and 32 hex digits."""
    return f"batch_{secrets.token_hex(16)}"


def decode_hash(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """A Redis hash reply as str -> str."""
    return {reply_text(k): reply_text(v) for k, v in raw.items()}


def _int_or_none(value: str | None) -> int | None:
    return None if value in (None, "") else int(float(value))


def file_object(fields: Mapping[str, str]) -> dict[str, Any]:
    """An OpenAI file object from its stored fields."""
    return {
        "id": fields["id"],
        "object": "file",
        "bytes": int(fields["bytes"]),
        "created_at": int(float(fields["created_at"])),
        "expires_at": None,
        "filename": fields["filename"],
        "purpose": fields["purpose"],
        "status": "processed",
        "status_details": None,
    }


def batch_object(fields: Mapping[str, str]) -> dict[str, Any]:
    """An OpenAI batch object from its stored fields."""
    body: dict[str, Any] = {
        "id": fields["id"],
        "object": "batch",
        "endpoint": fields["endpoint"],
        "errors": json.loads(fields["errors"]) if fields.get("errors") else None,
        "input_file_id": fields["input_file_id"],
        "completion_window": fields["completion_window"],
        "status": fields["status"],
        "output_file_id": fields.get("output_file_id") or None,
        "error_file_id": fields.get("error_file_id") or None,
    }
    body.update({name: _int_or_none(fields.get(name)) for name in TIMESTAMPS})
    body["request_counts"] = {name: int(fields.get(name) or 0) for name in ("total", "completed", "failed")}
    body["metadata"] = json.loads(fields["metadata"]) if fields.get("metadata") else None
    return body


def batch_errors(code: str, message: str, *, line: int | None = None, param: str | None = None) -> str:
    """The stored `errors` field of a failed batch: OpenAI's {"object": "list", "data": [...]}, as JSON."""
    return json.dumps({"object": "list",
                       "data": [{"code": code, "message": message, "param": param, "line": line}]})


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A cursor page: {"object": "list", "data", "first_id", "last_id", "has_more"}."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def output_line(line_id: str, custom_id: str, request_id: str, status: int, body: dict[str, Any]) -> str:
    """One line of a batch's output or error file for a request that got an HTTP answer."""
    response = {"status_code": status, "request_id": request_id, "body": body}
    return json.dumps({"id": line_id, "custom_id": custom_id, "response": response, "error": None})


def unexecuted_line(line_id: str, custom_id: str, code: str, message: str) -> str:
    """One line of a batch's error file for a request that never ran (expired, input unusable)."""
    return json.dumps({"id": line_id, "custom_id": custom_id, "response": None,
                       "error": {"code": code, "message": message}})
