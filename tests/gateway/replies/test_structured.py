"""Structured-output fields become one OutputConstraint in the job (the HTTP tests cover the refusals)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.replies import protocol, serving
from gateway.replies.structured import parse_constraint
from shared.messages import OutputConstraint
from shared.settings import Settings

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(("body", "expected"), [
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}},
     OutputConstraint(kind="json_schema", source='{"type":"object"}', param="response_format")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     OutputConstraint(kind="json_schema", source=json.dumps(SCHEMA, separators=(",", ":")),
                      param="response_format.json_schema.schema")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": False}}},
     OutputConstraint(kind="json_schema", source=json.dumps(SCHEMA, separators=(",", ":")), strict=False,
                      param="response_format.json_schema.schema")),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},  # no name: llama.cpp's clients
     OutputConstraint(kind="json_schema", source=json.dumps(SCHEMA, separators=(",", ":")),
                      param="response_format.json_schema.schema")),
    ({"response_format": {"type": "json_object", "schema": SCHEMA}},  # llama.cpp
     OutputConstraint(kind="json_schema", source=json.dumps(SCHEMA, separators=(",", ":")),
                      param="response_format.schema")),
    ({"json_schema": SCHEMA},  # llama.cpp
     OutputConstraint(kind="json_schema", source=json.dumps(SCHEMA, separators=(",", ":")), param="json_schema")),
    ({"grammar": 'root ::= "yes" | "no"'}, OutputConstraint(kind="grammar", source='root ::= "yes" | "no"',
                                                            param="grammar")),
    ({"regex": "[0-9]+", "response_format": {"type": "text"}},
     OutputConstraint(kind="regex", source="[0-9]+", param="regex")),
])
def test_each_source_becomes_one_constraint(body: dict[str, Any], expected: OutputConstraint | None) -> None:
    assert parse_constraint(body) == expected


def test_the_constraint_rides_in_the_job_of_chat_and_completions() -> None:
    settings = Settings()
    chat = protocol.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                "response_format": {"type": "json_object"}}, settings)
    completion = protocol.parse_completion({"model": "m", "prompt": ["a", "b"], "regex": "x+"}, settings)
    assert serving.build_jobs(chat, settings, "req-1", 0.0)[0].constraint.param == "response_format"
    jobs = serving.build_jobs(completion, settings, "req-2", 0.0)
    assert [j.constraint.source for j in jobs] == ["x+", "x+"]
    assert "x+" not in jobs[0].describe() and "regex(2 chars)" in jobs[0].describe()  # logs: sizes only
