"""Constrained sequences in the scheduler: batched, forked (n > 1), cached, preempted, resumed and speculated
sequences all keep their matcher exact, so every output matches its schema and equals a lone run."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.text.constraints import Constraint, ConstraintError
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, RequestDone, RequestFailed, SequenceStep

jsonschema = pytest.importorskip("jsonschema")

# Bounded strings and integers: the tiny model's random weights would otherwise write very long strings and
# fractions (a real model stops; tests/worker/engine/text/test_constraints_smollm2.py samples unbounded ones).
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                      "tag": {"type": "string", "maxLength": 6}},
     "required": ["id"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "sizes": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                           "maximum": 9},
                                                "minItems": 1, "maxItems": 3}},
     "required": ["color", "sizes"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "score": {"type": "integer", "minimum": -5, "maximum": 5}},
        "required": ["ok", "score"], "additionalProperties": False},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
     "required": ["inner", "code"], "additionalProperties": False},
]


def _prompt(engine: Any, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, engine.model.config.vocab_size, n)]


def _request(rid: str, prompt: list[int], schema: dict[str, Any], seed: int | None = 0, max_tokens: int = 300,
             **kw: Any) -> GenerationRequest:
    sampling = SamplingParams(temperature=1.0, seed=seed) if seed is not None else SamplingParams(temperature=0.0)
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling,
                              constraint=Constraint("json_schema", json.dumps(schema)))
    return GenerationRequest(rid, prompt, params, **kw)


def _run(sched: Scheduler) -> dict[str, dict[int, tuple[list[int], str, str]]]:
    """Step until idle; request -> choice -> (token ids, text, finish reason)."""
    out: dict[str, dict[int, tuple[list[int], str, str]]] = {}
    for _ in range(20_000):
        if not sched.has_work:
            return out
        for event in sched.step():
            assert not isinstance(event, RequestFailed), event.message
            if isinstance(event, SequenceStep):
                ids, text, _ = out.setdefault(event.request_id, {}).get(event.index, ([], "", ""))
                o = event.output
                out[event.request_id][event.index] = (ids + [o.token_id], text + o.text, o.finish_reason or "")
    raise AssertionError("scheduler did not go idle")


@pytest.mark.parametrize("schema", range(len(SCHEMAS)))
def test_twenty_seeded_samples_in_one_batch_all_validate(tiny_engine: Any, schema: int) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig(max_sequences=20))
    for seed in range(20):
        sched.add(_request(f"r{seed}", _prompt(tiny_engine, 8, seed), SCHEMAS[schema], seed=seed))
    got = _run(sched)
    for seed in range(20):
        _, text, reason = got[f"r{seed}"][0]
        assert reason == "stop", f"seed {seed}"
        jsonschema.validate(json.loads(text), SCHEMAS[schema])


def test_n_choices_each_validate_and_differ(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("n4", _prompt(tiny_engine, 20, 1), SCHEMAS[1], seed=5, n=4))
    choices = _run(sched)["n4"]
    for _, text, reason in choices.values():
        assert reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMAS[1])
    assert len({text for _, text, _ in choices.values()}) > 1
    alone = Scheduler(tiny_engine, SchedulerConfig())
    alone.add(_request("one", _prompt(tiny_engine, 20, 1), SCHEMAS[1], seed=5 + 2))
    assert _run(alone)["one"][0] == choices[2]  # choice i samples with seed + i, its matcher its own


def test_a_prefix_cache_hit_gives_the_same_constrained_output(tiny_engine: Any) -> None:
    prompt = _prompt(tiny_engine, 300, 7)
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("first", prompt, SCHEMAS[2], seed=3))
    first = _run(sched)["first"][0]
    sched.add(_request("second", prompt, SCHEMAS[2], seed=3))
    second = _run(sched)["second"][0]
    assert sched.blocks.stats.hits == 1
    assert first == second
    jsonschema.validate(json.loads(second[1]), SCHEMAS[2])


def test_preemption_keeps_constrained_outputs(tiny_engine: Any) -> None:
    per_token = tiny_engine.model.config.kv_bytes_per_token
    prompts = [_prompt(tiny_engine, 200, 100 + i) for i in range(4)]
    schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 60, "maxLength": 90}},
              "required": ["text"], "additionalProperties": False}
    expected = []
    for i, p in enumerate(prompts):
        alone = Scheduler(tiny_engine, SchedulerConfig(prefix_cache=False))
        alone.add(_request(f"r{i}", p, schema, seed=i))
        expected.append(_run(alone)[f"r{i}"][0])
    sched = Scheduler(tiny_engine, SchedulerConfig(max_sequences=4, kv_budget_mib=1024 * per_token / 2**20))
    for i, p in enumerate(prompts):
        sched.add(_request(f"r{i}", p, schema, seed=i))
    got = _run(sched)
    assert sched.stats.preemptions > 0
    for i in range(4):
        assert got[f"r{i}"][0] == expected[i], f"request {i} changed by preemption"
        jsonschema.validate(json.loads(got[f"r{i}"][0][1]), schema)


def test_a_resumed_constrained_request_continues_exactly(tiny_engine: Any) -> None:
    prompt = _prompt(tiny_engine, 30, 41)
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("r", prompt, SCHEMAS[0], seed=9, n=2))
    full = _run(sched)["r"]
    cut = 5
    resumed = Scheduler(tiny_engine, SchedulerConfig())
    resumed.add(_request("r", prompt, SCHEMAS[0], seed=9, n=2, resume_tokens=[full[i][0][:cut] for i in (0, 1)]))
    rest = _run(resumed)["r"]
    for i in (0, 1):
        assert full[i][0][:cut] + rest[i][0] == full[i][0]


def test_speculative_drafts_are_verified_against_the_constraint(tiny_engine: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": ["xy", "zw"]},
                                                     "maxItems": 30}},
              "required": ["a"], "additionalProperties": False}
    outputs = []
    for k in (0, 6):
        sched = Scheduler(tiny_engine, SchedulerConfig(speculative_tokens=k))
        sched.add(_request("g", _prompt(tiny_engine, 12, 3), schema, seed=None))
        outputs.append(_run(sched)["g"][0])
        if k:
            assert sched.stats.speculated_tokens > 0
    assert outputs[0] == outputs[1]
    jsonschema.validate(json.loads(outputs[0][1]), schema)


def test_a_failing_matcher_ends_the_request_with_a_clear_error(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("bad", _prompt(tiny_engine, 5, 2), SCHEMAS[0], seed=1))
    seq = sched._groups["bad"].sequences[0]
    with pytest.raises(ConstraintError):  # not JSON: the matcher enters its error state and stays there
        seq.gen.constraint.advance(tiny_engine.tokenizer.encode("x", add_bos=False)[0])
    events = []
    while sched.has_work:
        events += sched.step()
    failed = [e for e in events if isinstance(e, RequestFailed)]
    assert len(failed) == 1 and "output constraint" in failed[0].message
    assert not [e for e in events if isinstance(e, RequestDone)]
