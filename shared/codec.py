"""The only msgpack encoding and decoding of wire messages (msgspec Structs, see shared.messages).

A message on the wire is a msgpack map: {"kind": <tag>, <field>: <value>, ..., "version": WIRE_VERSION};
nested structs are plain maps, logit_bias a map with integer keys. Decoding validates everything while it
builds (msgspec): the size, that the bytes are exactly one map, the tag, that no field is missing, unknown
or of the wrong type, the message's own invariants, and then the version. Any failure is a
`WireFormatError`; a message is never half-read.
"""

from __future__ import annotations

import msgspec

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

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)  # type: ignore[arg-type]


class _Header(msgspec.Struct):
    """Just the tag and version of a message, to explain why a full decode failed."""

    kind: object = None
    version: object = None


_header_decoder = msgspec.msgpack.Decoder(_Header)
_MESSAGE_CLASSES = frozenset(MESSAGE_TYPES)
_TAGS = frozenset(cls.kind for cls in MESSAGE_TYPES)


class WireFormatError(ValueError):
    """Bytes that are not a valid message of this wire version; the message says what is wrong."""


def encode(message: Message) -> bytes:
    """Encode any wire message (job, event or cancel notice) to msgpack bytes."""
    if type(message) not in _MESSAGE_CLASSES:
        raise WireFormatError(f"cannot encode {type(message).__name__}: not a wire message")
    try:
        data = _encoder.encode(message)
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
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
        message = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise WireFormatError(_explain(data, exc)) from None
    except msgspec.DecodeError as exc:
        raise WireFormatError(f"not a msgpack message: {exc}") from None
    if message.version != WIRE_VERSION:
        raise WireFormatError(
            f"{message.kind} message has wire version {message.version}; this side speaks {WIRE_VERSION}"
        )
    return message


def _explain(data: bytes, exc: msgspec.ValidationError) -> str:
    """The reason a well-formed msgpack value is not a message; a foreign version is named as such."""
    try:
        header = _header_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return f"a message must be a map with a 'kind' tag: {exc}"
    if not isinstance(header.kind, str) or header.kind not in _TAGS:
        return f"unknown message type {header.kind!r}"
    if header.version is not None and header.version != WIRE_VERSION:
        if type(header.version) is not int:
            return f"{header.kind} message has no integer version"
        return f"{header.kind} message has wire version {header.version}; this side speaks {WIRE_VERSION}"
    return f"invalid {header.kind} message: {exc}"


def encode_job(job: Job) -> bytes:
    """Encode a job (generate, embed or text). An untraced job leaves its `trace` out, so its bytes are those of
    a worker that predates the field (a cluster upgraded one process at a time serves untraced jobs throughout)."""
    if not isinstance(job, JOB_TYPES):
        raise WireFormatError(f"{type(job).__name__} is not a job")
    data = encode(job)
    if getattr(job, "trace", "") is None:
        fields = msgspec.msgpack.decode(data)
        del fields["trace"]
        data = _encoder.encode(fields)
    return data


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
