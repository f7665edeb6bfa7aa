"""Small readers for fields of a decoded JSON body; each failure is a 400 that names the field."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shared.errors import InvalidRequest
from shared.warm_pool import parse_keep_alive

_MISSING = object()
MAX_METADATA_PAIRS = 16  # OpenAI's limits on `metadata` (chat completions, batches)
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object (NaN and Infinity are refused)."""
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(
            "We could not parse the JSON body of your request: it is not valid JSON "
            f"({type(exc).__name__}). Send a JSON object with Content-Type: application/json."
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, got {_kind(body)}.")
    path = lone_surrogate_path(body)
    if path is not None:  # refused rather than replaced: silently changing a prompt is worse than a clear 400
        raise InvalidRequest(f"{path} contains a lone UTF-16 surrogate (such as \\ud800), which is not valid "
                             "Unicode; send well-formed text.", param=path)
    return body


def lone_surrogate_path(value: Any) -> str | None:
    """The path (e.g. 'messages[0].content') of the first string or key holding a lone surrogate, else None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and not _encodable(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                if not key.isascii() and not _encodable(key):
                    return path or "body"
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def invalid(param: str, message: str) -> InvalidRequest:
    """A 400 about `param`."""
    return InvalidRequest(f"Invalid value for '{param}': {message}", param=param)


def keep_alive_seconds(body: Mapping[str, Any]) -> float | None:
    """Ollama's keep_alive (seconds, or a duration such as "5m"; negative = forever); None when absent."""
    try:
        return parse_keep_alive(body.get("keep_alive"))
    except ValueError as exc:
        raise invalid("keep_alive", f"{exc}.") from None


def is_int(value: Any) -> bool:
    """True for JSON integers (not booleans)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for JSON numbers (not booleans, always finite)."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def string(body: Mapping[str, Any], name: str, *, default: Any = _MISSING, max_len: int = 1 << 20) -> Any:
    """A string field; required unless a default is given (null means the default)."""
    value = body.get(name)
    if value is None:
        if default is _MISSING:
            raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
        return default
    if not isinstance(value, str):
        raise invalid(name, f"expected a string, got {_kind(value)}.")
    if len(value) > max_len:
        raise invalid(name, f"longer than {max_len} characters.")
    return value


def text_within(value: Any, param: str, *, max_bytes: int) -> str:
    """`value` must be a string of at most `max_bytes` bytes in UTF-8 (a bound on free text, whatever its script)."""
    if not isinstance(value, str):
        raise invalid(param, f"expected a string, got {_kind(value)}.")
    if len(value) > max_bytes or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise invalid(param, f"longer than {max_bytes} bytes (UTF-8).")
    return value


def metadata(body: Mapping[str, Any], name: str = "metadata") -> dict[str, str] | None:
    """An OpenAI `metadata` object: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_PAIRS:
        raise invalid(name, f"expected an object of at most {MAX_METADATA_PAIRS} string pairs.")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS or not isinstance(item, str) or len(item) > MAX_METADATA_VALUE_CHARS:
            raise invalid(name, f"keys are at most {MAX_METADATA_KEY_CHARS} characters, values strings of at most "
                                f"{MAX_METADATA_VALUE_CHARS}.")
    return value


def boolean(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean field (null means the default)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, f"expected a boolean, got {_kind(value)}.")
    return value


def number(
    body: Mapping[str, Any],
    name: str,
    default: float,
    lo: float,
    hi: float,
    *,
    lo_open: bool = False,
) -> float:
    """A number field in [lo, hi] (or (lo, hi] with lo_open); null means the default."""
    value = body.get(name)
    if value is None:
        return default
    if not is_number(value):
        raise invalid(name, f"expected a number, got {_kind(value)}.")
    if value > hi or value < lo or (lo_open and value == lo):
        low = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
        raise invalid(name, f"{value!r} is out of range; it must be {low} and at most {hi:g}.")
    return float(value)


def integer(body: Mapping[str, Any], name: str, default: Any, lo: int, hi: int) -> Any:
    """An integer field in [lo, hi]; null means the default."""
    value = body.get(name)
    if value is None:
        return default
    return bounded_int(value, name, lo, hi)


def bounded_int(value: Any, param: str, lo: int, hi: int) -> int:
    """`value` must be an integer in [lo, hi]."""
    if not is_int(value):
        raise invalid(param, f"expected an integer, got {_kind(value)}.")
    if not lo <= value <= hi:
        raise invalid(param, f"{value} is out of range; it must be between {lo} and {hi}.")
    return int(value)


def choice(body: Mapping[str, Any], name: str, options: Sequence[str], default: str) -> str:
    """A string field that must be one of `options`; null means the default."""
    value = body.get(name)
    if value is None:
        return default
    if value not in options or not isinstance(value, str):
        raise invalid(name, f"{json.dumps(value)} is not one of {', '.join(map(repr, options))}.")
    return value


def token_ids(value: Any, param: str, *, vocab_limit: int = 1 << 31) -> list[int]:
    """A non-empty array of token ids."""
    if not isinstance(value, list) or not value:
        raise invalid(param, "expected a non-empty array of token ids.")
    if not all(is_int(t) and 0 <= t < vocab_limit for t in value):
        raise invalid(param, f"token ids must be integers between 0 and {vocab_limit - 1}.")
    return list(value)
