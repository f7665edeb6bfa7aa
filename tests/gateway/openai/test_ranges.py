"""Each sampling range is written once: the OpenAPI document states the protocol's constants, the protocol refuses
just past them, and the engine (which checks the extensions) accepts every value the gateway lets through."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admin.openapi import openapi_document
from gateway.anthropic import protocol as anthropic_protocol
from gateway.replies import protocol
from shared.errors import InvalidRequest
from shared.settings import Settings
from worker.engine.decode import sampling as engine

SETTINGS = Settings()
STEP = 1e-3
RANGES = {  # field -> (constant, low end open)
    "temperature": (protocol.TEMPERATURE_RANGE, False),
    "top_p": (protocol.TOP_P_RANGE, True),
    "presence_penalty": (protocol.PENALTY_RANGE, False),
    "frequency_penalty": (protocol.PENALTY_RANGE, False),
    "min_p": (protocol.MIN_P_RANGE, False),
    "repetition_penalty": (protocol.REPETITION_PENALTY_RANGE, False),
}
OPENAI_CHECKED = ("temperature", "top_p", "presence_penalty", "frequency_penalty")  # the rest: the engine's


def _schemas() -> dict[str, Any]:
    return openapi_document(SETTINGS)["components"]["schemas"]


def _number_schema(schema: dict[str, Any], name: str) -> dict[str, Any]:
    field = schema["properties"][name]
    return next(option for option in field["anyOf"] if option.get("type") == "number")


@pytest.mark.parametrize("request_schema", ["ChatCompletionRequest", "CompletionRequest"])
@pytest.mark.parametrize("name", sorted(RANGES))
def test_openapi_states_the_protocols_range(request_schema: str, name: str) -> None:
    (low, high), lo_open = RANGES[name]
    stated = _number_schema(_schemas()[request_schema], name)
    assert stated.get("exclusiveMinimum" if lo_open else "minimum") == low
    assert stated["maximum"] == high


def test_openapi_states_the_logit_bias_limits() -> None:
    stated = _schemas()["ChatCompletionRequest"]["properties"]["logit_bias"]["anyOf"][0]
    assert stated["maxProperties"] == protocol.MAX_LOGIT_BIAS_ENTRIES
    low, high = protocol.LOGIT_BIAS_RANGE
    assert (stated["additionalProperties"]["minimum"], stated["additionalProperties"]["maximum"]) == (low, high)


def _chat(**fields: Any) -> protocol.ChatRequest:
    return protocol.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}, SETTINGS)


@pytest.mark.parametrize("name", OPENAI_CHECKED)
def test_the_protocol_takes_its_ends_and_refuses_past_them(name: str) -> None:
    (low, high), lo_open = RANGES[name]
    assert getattr(_chat(**{name: high}).params.sampling, name) == high
    if not lo_open:
        assert getattr(_chat(**{name: low}).params.sampling, name) == low
    for outside in (high + STEP, low if lo_open else low - STEP):
        with pytest.raises(InvalidRequest) as refused:
            _chat(**{name: outside})
        assert refused.value.param == name


def test_the_protocol_refuses_a_bias_past_its_range() -> None:
    low, high = protocol.LOGIT_BIAS_RANGE
    assert _chat(logit_bias={"5": high, "6": low}).params.sampling.logit_bias == {5: high, 6: low}
    with pytest.raises(InvalidRequest):
        _chat(logit_bias={"5": high + STEP})


def test_anthropics_temperature_range_is_its_constant() -> None:
    low, high = anthropic_protocol.TEMPERATURE_RANGE
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    assert anthropic_protocol.parse_messages({**body, "temperature": high}, SETTINGS).params.sampling.temperature == high
    with pytest.raises(InvalidRequest):
        anthropic_protocol.parse_messages({**body, "temperature": high + STEP}, SETTINGS)
    assert (low, high) != protocol.TEMPERATURE_RANGE  # Anthropic's is its own (0..1), not OpenAI's


def test_the_engine_ranges_are_the_gateways() -> None:
    assert engine.REPETITION_PENALTY_RANGE == protocol.REPETITION_PENALTY_RANGE
    assert (-engine.MAX_PRESENCE_FREQUENCY, engine.MAX_PRESENCE_FREQUENCY) == protocol.PENALTY_RANGE
    assert (-engine.MAX_LOGIT_BIAS_MAGNITUDE, engine.MAX_LOGIT_BIAS_MAGNITUDE) == protocol.LOGIT_BIAS_RANGE


@pytest.mark.parametrize("end", [0, 1])
def test_the_engine_accepts_every_end_the_gateway_lets_through(end: int) -> None:
    values = {name: bounds[end] for name, (bounds, lo_open) in RANGES.items() if not (lo_open and end == 0)}
    engine.SamplingParams(**values, logit_bias={0: protocol.LOGIT_BIAS_RANGE[end]}).validate(vocab_size=8)


@pytest.mark.parametrize("name", ["min_p", "repetition_penalty"])
def test_the_engine_refuses_just_past_the_extensions_ranges(name: str) -> None:
    (low, high), _ = RANGES[name]
    for outside in (low - STEP, high + STEP):
        with pytest.raises(ValueError, match=name):
            engine.SamplingParams(**{name: outside}).validate(vocab_size=8)
