"""Round trips of every wire message and refusal of anything that is not one."""

from __future__ import annotations

import msgpack
import pytest

from shared import codec
from shared.codec import WireFormatError
from shared.messages import (
    WIRE_VERSION,
    CancelRequest,
    ChatMessage,
    ChoiceEndEvent,
    DoneEvent,
    EmbedJob,
    ErrorEvent,
    GenerateJob,
    Sampling,
    Timing,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
)

NOW = 1_700_000_000.0

MESSAGES = [
    GenerateJob(
        id="req-1",
        model="m",
        created=NOW,
        deadline=NOW + 60,
        priority="high",
        messages=[ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi", name="a")],
        max_tokens=32,
        n=2,
        sampling=Sampling(temperature=0.5, top_k=40, logit_bias={13: -100.0, 7: 2.5}, seed=42),
        stop=["\n\n", "END"],
        logprobs=3,
        stream=True,
    ),
    GenerateJob(id="req-2", model="m", created=NOW, deadline=NOW + 1, prompt="Once", echo=True),
    GenerateJob(id="req-3", model="m", created=NOW, deadline=NOW + 1, prompt_token_ids=[1, 2, 3], max_tokens=None),
    EmbedJob(id="req-4", model="e", created=NOW, deadline=NOW + 5, inputs=["a", "b"], pooling="last"),
    EmbedJob(id="req-5", model="e", created=NOW, deadline=NOW + 5, inputs=[[1, 2], [3]], normalize=False),
    TokenEvent(id="req-1", seq=0, index=1, text="Hel", token_ids=[5]),
    TokenEvent(
        id="req-1",
        seq=1,
        text="lo",
        token_ids=[6, 7],
        logprobs=[
            TokenLogprob(token_id=6, token="l", logprob=-0.25, bytes=[108], top=[TopLogprob(token_id=9, token="x", logprob=-2.0)]),
            TokenLogprob(token_id=7, token="o", logprob=None, bytes=None),
        ],
        echo=True,
    ),
    ChoiceEndEvent(id="req-1", seq=2, index=1, finish_reason='length'),
    DoneEvent(
        id="req-1",
        seq=3,
        usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
        timing=Timing(queue_s=0.1, first_token_s=0.2, total_s=0.3),
    ),
    DoneEvent(id="req-4", seq=0, usage=Usage(prompt_tokens=2, completion_tokens=0, total_tokens=2), embeddings=[[0.5, -1.0], [1.0, 0.0]]),
    ErrorEvent(id="req-1", seq=0, status=400, type="invalid_request_error", code="context_length_exceeded", param="messages", message="too long"),
    ErrorEvent(id="req-1", seq=4, status=429, type="rate_limit_error", message="busy", retry_after=1.5),
    CancelRequest(id="req-1", model="m", reason="client_disconnected"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: object) -> None:
    data = codec.encode(message)  # type: ignore[arg-type]
    assert isinstance(data, bytes)
    assert codec.decode(data) == message


def test_wire_shape_is_a_tagged_map() -> None:
    body = msgpack.unpackb(codec.encode(MESSAGES[7]), raw=False)
    assert body == {"kind": "choice_end", "id": "req-1", "seq": 2, "index": 1, "finish_reason": "length",
                    "stop_sequence": None, "version": WIRE_VERSION}
    job = msgpack.unpackb(codec.encode(MESSAGES[0]), raw=False, strict_map_key=False)
    assert job["kind"] == "generate"
    assert job["sampling"]["logit_bias"] == {13: -100.0, 7: 2.5}


def test_typed_helpers_check_the_kind() -> None:
    job_bytes = codec.encode_job(MESSAGES[1])  # type: ignore[arg-type]
    event_bytes = codec.encode_event(MESSAGES[5])  # type: ignore[arg-type]
    assert codec.decode_job(job_bytes) == MESSAGES[1]
    assert codec.decode_event(event_bytes) == MESSAGES[5]
    with pytest.raises(WireFormatError, match="expected an event"):
        codec.decode_event(job_bytes)
    with pytest.raises(WireFormatError, match="expected a job"):
        codec.decode_job(event_bytes)
    with pytest.raises(WireFormatError, match="not a job"):
        codec.encode_job(MESSAGES[5])  # type: ignore[arg-type]
    with pytest.raises(WireFormatError, match="not an event"):
        codec.encode_event(MESSAGES[0])  # type: ignore[arg-type]


def _raw(**body: object) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _token_body(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {"kind": "token", "version": WIRE_VERSION, "id": "r", "seq": 0, "text": "x"}
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "not a msgpack message"),
        (b"\xc1", "not a msgpack message"),
        (b"\x93\x01\x02\x03", "must be a map"),
        (_raw(kind="token", version=WIRE_VERSION, id="r", seq=0, text="x") + b"\x00", "not a msgpack message"),
        (_raw(kind="nope", version=WIRE_VERSION), "unknown message type 'nope'"),
        (_raw(version=WIRE_VERSION), "unknown message type None"),
        (msgpack.packb(_token_body(version=WIRE_VERSION + 1)), "wire version 2; this side speaks 1"),
        (msgpack.packb(_token_body(version="1")), "no integer version"),
        (msgpack.packb({k: v for k, v in _token_body().items() if k != "seq"}), "missing required field `seq`"),
        (msgpack.packb(_token_body(surprise=1)), "unknown field `surprise`"),
        (msgpack.packb(_token_body(seq="0")), r"invalid token message: Expected `int`, got `str` - at `\$\.seq`"),
        (msgpack.packb(_token_body(seq=True)), r"Expected `int`, got `bool` - at `\$\.seq`"),
        (msgpack.packb(_token_body(seq=-1)), r"Expected `int` >= 0 - at `\$\.seq`"),
        (msgpack.packb(_token_body(token_ids=[1, "2"])), r"Expected `int`, got `str` - at `\$\.token_ids\[1\]`"),
        (msgpack.packb(_token_body(token_ids=[1], logprobs=[])), "one entry per token id"),
        (msgpack.packb(_token_body(text=b"bytes", token_ids=[])), r"Expected `str`, got `bytes` - at `\$\.text`"),
        (b"\x81\xa4kind\xc7\x01\x05x", "unknown message type"),
        (
            _raw(kind="choice_end", version=WIRE_VERSION, id="r", seq=0, finish_reason="bored"),
            r"Invalid enum value 'bored' - at `\$\.finish_reason`",
        ),
        (
            _raw(kind="generate", version=WIRE_VERSION, id="r", model="m", created=1.0, deadline=2.0),
            "exactly one of prompt",
        ),
        (
            _raw(kind="generate", version=WIRE_VERSION, id="r", model="m", created=1.0, deadline=2.0, prompt="p", priority="urgent"),
            r"Invalid enum value 'urgent' - at `\$\.priority`",
        ),
        (
            _raw(kind="generate", version=WIRE_VERSION, id="r", model="m", created=1.0, deadline=2.0, prompt="p", sampling={"top_p": "0"}),
            r"Expected `float`, got `str` - at `\$\.sampling\.top_p`",
        ),
        (
            _raw(kind="generate", version=WIRE_VERSION, id="r", model="m", created=1.0, deadline=2.0, prompt="p", n=0),
            r"Expected `int` >= 1 - at `\$\.n`",
        ),
        (
            _raw(kind="error", version=WIRE_VERSION, id="r", seq=0, status=200, type="t", message="m"),
            r"Expected `int` >= 400 - at `\$\.status`",
        ),
        (
            _raw(kind="embed", version=WIRE_VERSION, id="r", model="m", created=1.0, deadline=2.0, inputs=[["a"], [1]]),
            r"Expected `int`, got `str` - at `\$\.inputs\[0\]\[0\]`",
        ),
        (
            _raw(kind="embed", version=WIRE_VERSION, id="r", model="m", created=1.0, deadline=2.0, inputs=["a", [1]]),
            "all strings or all token-id lists",
        ),
    ],
)
def test_refuses_what_is_not_a_valid_message(data: bytes, match: str) -> None:
    with pytest.raises(WireFormatError, match=match):
        codec.decode(data)


def test_refuses_invalid_utf8_and_unhashable_keys() -> None:
    with pytest.raises(WireFormatError):
        codec.decode(b"\x81\xa2\xff\xfe\x01")
    with pytest.raises(WireFormatError):
        codec.decode(b"\x81\x91\x01\x01")  # {[1]: 1}


def test_refuses_oversized_input() -> None:
    with pytest.raises(WireFormatError, match="over"):
        codec.decode(b"\x00" * (codec.MAX_MESSAGE_BYTES + 1))


def test_refuses_non_bytes_and_non_messages() -> None:
    with pytest.raises(WireFormatError, match="expected bytes"):
        codec.decode("text")  # type: ignore[arg-type]
    with pytest.raises(WireFormatError, match="not a wire message"):
        codec.encode(Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2))  # type: ignore[arg-type]


def test_encode_reports_unpackable_values() -> None:
    class Weird:
        """Something msgpack cannot pack."""

    event = TokenEvent(id="r", seq=0, text="x", token_ids=[Weird()])  # type: ignore[list-item]
    with pytest.raises(WireFormatError, match="cannot encode token message"):
        codec.encode(event)


def test_floats_accept_integers_and_keep_infinities() -> None:
    data = _raw(kind="done", version=WIRE_VERSION, id="r", seq=0, usage={"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}, embeddings=[[1, 2.5]])
    event = codec.decode(data)
    assert isinstance(event, DoneEvent)
    assert event.embeddings == [[1.0, 2.5]]
    assert all(type(v) is float for v in event.embeddings[0])
    lp = TokenEvent(id="r", seq=0, text="", token_ids=[1], logprobs=[TokenLogprob(token_id=1, token="", logprob=float("-inf"))])
    assert codec.decode(codec.encode(lp)) == lp


def test_the_wire_checks_types_not_sampling_ranges() -> None:
    """Out-of-range sampling values travel; the engine's SamplingParams.validate refuses them (one rule, one place)."""
    job = GenerateJob(id="r", model="m", created=NOW, deadline=NOW + 1, prompt="p",
                      sampling=Sampling(top_p=0.0, min_p=7.0, repetition_penalty=-1.0))
    assert codec.decode(codec.encode(job)) == job


def test_encode_refuses_lone_surrogates_and_numpy_ints() -> None:
    import numpy as np

    with pytest.raises(WireFormatError, match="cannot encode generate message"):
        codec.encode(GenerateJob(id="r", model="m", created=NOW, deadline=NOW + 1, prompt="hi \ud800"))
    with pytest.raises(WireFormatError, match="cannot encode token message"):
        codec.encode(TokenEvent(id="r", seq=0, text="x", token_ids=[np.int64(3)]))  # type: ignore[list-item]


def test_finish_reason_is_one_literal_type() -> None:
    end = codec.decode(_raw(kind="choice_end", version=WIRE_VERSION, id="r", seq=0, finish_reason="cancelled"))
    assert isinstance(end, ChoiceEndEvent) and end.finish_reason == "cancelled"
