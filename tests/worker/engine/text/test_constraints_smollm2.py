"""Structured output on the real SmolLM2: 20 seeded samples per schema at temperature 1 all validate (in one
batch, as n=4 choices, and after a preemption). Strings carry a maxLength: at temperature 1 a 135M model
inside a free string rambles past any max_tokens (valid so far, but never closed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.kv.pool import DEFAULT_BLOCK_SIZE
from worker.engine.text.constraints import Constraint
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, RequestFailed, SequenceStep

pytestmark = pytest.mark.slow
jsonschema = pytest.importorskip("jsonschema")

SCHEMAS: dict[str, dict[str, Any]] = {
    "required_and_optional": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                               "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                                               "email": {"type": "string", "maxLength": 30}},
                              "required": ["name", "age"], "additionalProperties": False},
    "enum_and_array": {"type": "object", "properties": {
        "mood": {"enum": ["happy", "sad", "calm"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3}},
        "required": ["mood", "tags"], "additionalProperties": False},
    "nested_and_bounded": {"type": "object", "properties": {
        "city": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                  "population": {"type": "integer", "minimum": 0,
                                                                 "maximum": 10**10}},
                 "required": ["name", "population"], "additionalProperties": False},
        "rating": {"type": "number", "minimum": 0, "maximum": 5},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["city", "rating", "code"], "additionalProperties": False},
}


def _chat(engine: Any, schema: dict[str, Any]) -> list[int]:
    ask = f"Reply with one JSON object that matches this JSON schema: {json.dumps(schema)}"
    return engine.encode_chat([{"role": "user", "content": ask}])


def _request(rid: str, prompt: list[int], schema: dict[str, Any], seed: int, n: int = 1) -> GenerationRequest:
    params = GenerationParams(max_tokens=120, sampling=SamplingParams(temperature=1.0, seed=seed),
                              constraint=Constraint("json_schema", json.dumps(schema)))
    return GenerationRequest(rid, prompt, params, n=n)


def _texts(sched: Scheduler) -> dict[tuple[str, int], tuple[str, str]]:
    out: dict[tuple[str, int], tuple[str, str]] = {}
    while sched.has_work:
        for event in sched.step():
            assert not isinstance(event, RequestFailed), event.message
            if isinstance(event, SequenceStep):
                text, _ = out.get((event.request_id, event.index), ("", ""))
                out[(event.request_id, event.index)] = (text + event.output.text, event.output.finish_reason or "")
    return out


def test_twenty_samples_per_schema_validate(smollm2_engine: Any) -> None:
    sched = Scheduler(smollm2_engine, SchedulerConfig(max_sequences=64, kv_budget_mib=512))
    for name, schema in SCHEMAS.items():  # every schema in one batch: 60 rows, each with its own matcher
        prompt = _chat(smollm2_engine, schema)
        for seed in range(16):
            sched.add(_request(f"{name}-{seed}", prompt, schema, seed))
        sched.add(_request(f"{name}-n4", prompt, schema, 100, n=4))  # four more as the choices of one request
    got = _texts(sched)
    assert len(got) == 20 * len(SCHEMAS)
    for (rid, index), (text, reason) in got.items():
        assert reason == "stop", f"{rid}/{index}: {text!r}"
        jsonschema.validate(json.loads(text), SCHEMAS[rid.rsplit("-", 1)[0]])


def test_samples_validate_across_a_preemption(smollm2_engine: Any) -> None:
    schema = SCHEMAS["nested_and_bounded"]
    prompt = _chat(smollm2_engine, schema)
    size = DEFAULT_BLOCK_SIZE  # every prompt fits at admission, not the prompts plus their JSON
    blocks = 4 * -(-len(prompt) // size) + 2
    budget = blocks * size * smollm2_engine.model.config.kv_bytes_per_token / 2**20
    sched = Scheduler(smollm2_engine, SchedulerConfig(max_sequences=4, kv_budget_mib=budget, prefix_cache=False))
    for seed in range(4):
        sched.add(_request(f"p{seed}", prompt, schema, seed))
    got = _texts(sched)
    assert sched.stats.preemptions > 0
    for text, reason in got.values():
        assert reason == "stop"
        jsonschema.validate(json.loads(text), schema)
