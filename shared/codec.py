"""The only msgpack encoding and decoding of wire messages.

A message on the wire is a msgpack map: {"kind": <tag>, "version": WIRE_VERSION, <field>: <value>, ...};
nested dataclasses are plain maps, enums their string value, logit_bias a map with integer keys.
Decoding checks everything before building anything: the size, that the bytes are exactly one map, the
tag, the version, that no field is missing, unknown or of the wrong type, and the message's own
invariants. Any failure is a `WireFormatError`; a message is never half-read.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

import msgpack

from shared.messages import (
    EVENT_TYPES,
    JOB_TYPES,
    MESSAGE_TYPES,
    WIRE_VERSION,
    Event,
    Job,
    Message,
)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
TAG_KEY = "kind"  # not "type": ErrorEvent has a field of that name

_TAGS: dict[str, type] = {cls.kind: cls for cls in MESSAGE_TYPES}
_HINTS: dict[type, dict[str, Any]] = {}
_FAST_ITEMS = (int, float, str)


class WireFormatError(ValueError):
    """Bytes that are not a valid message of this wire version; the message says what is wrong."""


def encode(message: Message) -> bytes:
    """Encode any wire message (job, event or cancel notice) to msgpack bytes."""
    if type(message) not in _TAGS.values():
        raise WireFormatError(f"cannot encode {type(message).__name__}: not a wire message")
    body = {TAG_KEY: message.kind, **_to_wire(message)}
    try:
        data = msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireFormatError(f"cannot encode {message.kind} message: {exc}") from exc
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireFormatError(f"{message.kind} message is {len(data)} bytes, over {MAX_MESSAGE_BYTES}")
    return data


def decode(data: bytes) -> Message:
    """Decode msgpack bytes into a wire message, or raise WireFormatError."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireFormatError(f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireFormatError(f"message is {len(data)} bytes, over {MAX_MESSAGE_BYTES}")
    try:
        # unpackb bounds every string, array and map by the input's length, checked above.
        body = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise WireFormatError(f"not a msgpack message: {exc}") from exc
    if not isinstance(body, dict):
        raise WireFormatError(f"a message must be a map, got {type(body).__name__}")
    tag = body.pop(TAG_KEY, None)
    cls = _TAGS.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise WireFormatError(f"unknown message type {tag!r}")
    version = body.get("version")
    if type(version) is not int:
        raise WireFormatError(f"{tag} message has no integer version")
    if version != WIRE_VERSION:
        raise WireFormatError(f"{tag} message has wire version {version}; this side speaks {WIRE_VERSION}")
    return _build(cls, body, tag)


def encode_job(job: Job) -> bytes:
    """Encode a job (generate or embed)."""
    if not isinstance(job, JOB_TYPES):
        raise WireFormatError(f"{type(job).__name__} is not a job")
    return encode(job)


def decode_job(data: bytes) -> Job:
    """Decode bytes that must hold a job."""
    message = decode(data)
    if not isinstance(message, JOB_TYPES):
        raise WireFormatError(f"expected a job, got a {message.kind} message")
    return message  # type: ignore[return-value]


def encode_event(event: Event) -> bytes:
    """Encode an event (token, choice_end, done, error)."""
    if not isinstance(event, EVENT_TYPES):
        raise WireFormatError(f"{type(event).__name__} is not an event")
    return encode(event)


def decode_event(data: bytes) -> Event:
    """Decode bytes that must hold an event."""
    message = decode(data)
    if not isinstance(message, EVENT_TYPES):
        raise WireFormatError(f"expected an event, got a {message.kind} message")
    return message  # type: ignore[return-value]


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        resolved = typing.get_type_hints(cls)
        hints = {f.name: resolved[f.name] for f in dataclasses.fields(cls)}
        _HINTS[cls] = hints
    return hints


def _build(cls: type, body: Any, path: str) -> Any:
    if not isinstance(body, dict):
        raise WireFormatError(f"{path}: expected a map, got {type(body).__name__}")
    hints = _hints(cls)
    unknown = [k for k in body if k not in hints]
    if unknown:
        raise WireFormatError(f"{path}: unknown field(s) {', '.join(map(repr, unknown))}")
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in body]
    if missing:
        raise WireFormatError(f"{path}: missing field(s) {', '.join(missing)}")
    values = {name: _convert(value, hints[name], f"{path}.{name}") for name, value in body.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise WireFormatError(f"{path}: {exc}") from exc


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        errors = []
        for arm in get_args(tp):
            try:
                return _convert(value, arm, path)
            except WireFormatError as exc:
                errors.append(str(exc))
        raise WireFormatError(f"{path}: matches none of {tp}: {'; '.join(errors)}")
    if origin is Literal:
        if isinstance(value, str) and value in get_args(tp):
            return value
        raise WireFormatError(f"{path}: expected one of {get_args(tp)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise WireFormatError(f"{path}: expected a list, got {type(value).__name__}")
        (item,) = get_args(tp)
        if item in _FAST_ITEMS and all(type(v) is item for v in value):
            return value  # fast path for long lists of token ids, floats or strings
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise WireFormatError(f"{path}: expected a map, got {type(value).__name__}")
        key_tp, value_tp = get_args(tp)
        return {
            _convert(k, key_tp, f"{path} key"): _convert(v, value_tp, f"{path}[{k!r}]")
            for k, v in value.items()
        }
    return _convert_plain(value, tp, path)


def _convert_plain(value: Any, tp: Any, path: str) -> Any:
    if tp is type(None):
        if value is None:
            return None
    elif tp is bool or tp is int or tp is str:
        if type(value) is tp:
            return value
    elif tp is float:
        if type(value) is float or type(value) is int:
            return float(value)
    elif isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise WireFormatError(
                f"{path}: expected one of {[m.value for m in tp]}, got {value!r}"
            ) from None
    elif dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    else:
        raise WireFormatError(f"{path}: unsupported schema type {tp!r}")
    expected = "null" if tp is type(None) else getattr(tp, "__name__", str(tp))
    raise WireFormatError(f"{path}: expected {expected}, got {type(value).__name__}")
