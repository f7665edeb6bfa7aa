"""Output constraints: compile errors carry the compiler's message; the mask and the matcher hold each sequence
to its grammar, end it when the grammar is complete, and copy exactly."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.text.constraints import (
    NUMBER_BOUND,
    NUMBER_STEP,
    Constraint,
    ConstraintError,
    narrow_schema,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def _json(schema: dict[str, Any], strict: bool = True) -> Constraint:
    return Constraint("json_schema", json.dumps(schema), strict)


def _generate(engine: Any, constraint: Constraint, seed: int, max_tokens: int = 200) -> tuple[list[int], str, str]:
    params = GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(temperature=1.0, seed=seed),
                              constraint=constraint)
    gen = engine.new_generation([5, 6, 7], params)
    logits = np.random.default_rng(seed).standard_normal((max_tokens, engine.model.config.vocab_size))  # (T, V)
    text = []
    for row in logits:
        out = gen.accept_logits(row.astype(np.float32))
        text.append(out.text)
        if out.finish_reason:
            return gen.generated_ids, "".join(text), out.finish_reason
    raise AssertionError("never finished")


@pytest.mark.parametrize(("constraint", "message"), [
    (Constraint("json_schema", '{"type": "strin"}'), "Invalid type: strin"),
    (Constraint("json_schema", '{"type": "array", "uniqueItems": true}'), 'Unimplemented keys: ["uniqueItems"]'),
    (Constraint("json_schema", '{"type": '), "Expecting value"),
    (Constraint("regex", "[0-9"), "unclosed character class"),
    (Constraint("grammar", 'root ::= "a | "b"'), "GBNF"),
    (Constraint("grammar", 'start: "a" | b'), "unknown name"),
])
def test_bad_constraints_fail_with_the_compilers_message(tiny_engine: Any, constraint: Constraint, message: str) -> None:
    with pytest.raises(ConstraintError, match=message.replace("[", r"\[").replace("(", r"\(")):
        tiny_engine.compile_constraint(constraint)


def test_strict_false_ignores_unsupported_keywords(tiny_engine: Any) -> None:
    tiny_engine.compile_constraint(_json({"type": "array", "uniqueItems": True, "maxItems": 2}, strict=False))


def test_the_mask_allows_only_what_the_grammar_allows(tiny_engine: Any) -> None:
    gen = tiny_engine.new_generation([5], GenerationParams(max_tokens=10, constraint=Constraint("regex", "(yes|no)")))
    tokenizer = tiny_engine.tokenizer
    assert {tokenizer.token_bytes(int(t)) for t in gen.constraint.allowed()} == {b"y", b"n"}
    inside_string = tiny_engine.new_generation([5], GenerationParams(max_tokens=10, constraint=_json(PERSON)))
    for token in tokenizer.encode('{"name": "', add_bos=False):
        inside_string.constraint.advance(token)
    allowed = set(inside_string.constraint.allowed().tolist())
    assert tokenizer.encode("a", add_bos=False)[0] in allowed
    assert not any(tokenizer.is_special(t) for t in allowed)  # <|im_start|> is not text inside a JSON string


@pytest.mark.parametrize("seed", range(20))
def test_sampled_output_always_matches_the_schema(tiny_engine: Any, seed: int) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    ids, text, reason = _generate(tiny_engine, _json(PERSON), seed)
    assert reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    assert ids[-1] not in tiny_engine.tokenizer.eog_token_ids  # the grammar ended it: no step spent on EOS


def test_a_grammar_not_done_within_max_tokens_ends_with_length(tiny_engine: Any) -> None:
    _, text, reason = _generate(tiny_engine, _json(PERSON), 3, max_tokens=4)
    assert reason == "length" and text.startswith("{")


def test_a_regex_and_a_gbnf_grammar_are_followed(tiny_engine: Any) -> None:
    _, text, reason = _generate(tiny_engine, Constraint("regex", r"[0-9]{3}-[a-z]{2}"), 1)
    assert reason == "stop" and len(text) == 6 and text[3] == "-" and text[:3].isdigit()
    _, text, _ = _generate(tiny_engine, Constraint("grammar", 'root ::= "the " ("cat" | "dog")'), 2)
    assert text in ("the cat", "the dog")


def test_json_whitespace_is_bounded(tiny_engine: Any) -> None:
    gen = tiny_engine.new_generation([5], GenerationParams(max_tokens=10, constraint=_json({"type": "object"})))
    space = tiny_engine.tokenizer.encode(" ", add_bos=False)
    gen.constraint.advance(tiny_engine.tokenizer.encode("{", add_bos=False)[0])
    gen.constraint.advance(space[0])
    assert space[0] not in gen.constraint.allowed()  # one space, never two


def test_a_copied_matcher_is_independent(tiny_engine: Any) -> None:
    gen = tiny_engine.new_generation([5], GenerationParams(max_tokens=10, constraint=Constraint("regex", "ab|ac")))
    a, b, c = (tiny_engine.tokenizer.encode(x, add_bos=False)[0] for x in "abc")
    gen.constraint.advance(a)
    twin = gen.constraint.copy()
    assert twin.advance(b)  # "ab" is complete
    assert not gen.constraint.complete and gen.constraint.advance(c)
    with pytest.raises(ConstraintError):
        twin.advance(c)


def test_unbounded_numbers_get_bounds_and_set_bounds_are_kept() -> None:
    schema = {"type": "object", "properties": {
        "n": {"type": "number"}, "i": {"type": "integer", "minimum": 3}, "z": {"type": ["number", "null"], "maximum": 1},
        "type": {"enum": [{"type": "number"}]}}, "$defs": {"big": {"type": "integer", "minimum": 10**20}}}
    narrowed = narrow_schema(schema)
    props = narrowed["properties"]
    assert props["n"] == {"type": "number", "minimum": -NUMBER_BOUND, "maximum": NUMBER_BOUND, "multipleOf": NUMBER_STEP}
    assert props["i"] == {"type": "integer", "minimum": 3, "maximum": NUMBER_BOUND}
    assert props["z"] == {"type": ["number", "null"], "maximum": 1, "minimum": -NUMBER_BOUND, "multipleOf": NUMBER_STEP}
    assert props["type"] == {"enum": [{"type": "number"}]}  # data, not a schema
    assert narrowed["$defs"]["big"] == {"type": "integer", "minimum": 10**20}  # a bound would make it unsatisfiable
    assert schema["properties"]["n"] == {"type": "number"}  # the caller's schema is not changed


def test_objects_that_list_properties_get_no_others_unless_they_say_so() -> None:
    inner = {"type": "object", "properties": {"a": {"type": "string"}}}
    schema = {"type": "object", "properties": {"x": inner, "y": {**inner, "additionalProperties": True},
                                               "z": {"type": "object"}}}
    props = narrow_schema(schema)["properties"]
    assert narrow_schema(schema)["additionalProperties"] is False and props["x"]["additionalProperties"] is False
    assert props["y"]["additionalProperties"] is True and "additionalProperties" not in props["z"]  # any object
    combined = narrow_schema({"allOf": [inner, {"properties": {"b": {"type": "string"}}}]})
    assert "additionalProperties" not in combined["allOf"][0]  # allOf branches combine their properties


def test_a_number_cannot_run_on(tiny_engine: Any) -> None:
    gen = tiny_engine.new_generation([5], GenerationParams(max_tokens=40, constraint=_json({"type": "number"})))
    digits = tiny_engine.tokenizer.encode("1234567890123456", add_bos=False)
    with pytest.raises(ConstraintError):
        for token in digits + tiny_engine.tokenizer.encode("7", add_bos=False):
            gen.constraint.advance(token)
