"""Structured-output fields of a request: OpenAI's response_format and llama.cpp's json_schema, grammar and regex.

The gateway checks shape and size only and puts the constraint in the job; the worker compiles it (with
llguidance, against the model's vocabulary) and answers one that does not compile with a 400 that names the
field (`param`) and carries the compiler's message. That way the gateway stays light (no compiler, no
tokenizer) and a schema is compiled once, by the side that needs the compiled form.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.http.fields import invalid
from shared.messages import OutputConstraint

MAX_SCHEMA_CHARS = 64 * 1024  # a schema, as compact JSON text
MAX_SCHEMA_DEPTH = 32  # nesting of objects and arrays in a schema
MAX_GRAMMAR_CHARS = 64 * 1024  # a GBNF / Lark grammar or a regex
SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for json_schema.name
SOURCES = ("response_format", "json_schema", "grammar", "regex")


def parse_constraint(body: dict[str, Any]) -> OutputConstraint | None:
    """The output constraint a body asks for (at most one of SOURCES), or None for free text."""
    given = [name for name in SOURCES if body.get(name) is not None and not _is_text_format(name, body[name])]
    if len(given) > 1:
        raise invalid(given[1], f"only one of {', '.join(SOURCES)} may constrain the output; got {' and '.join(given)}.")
    if not given:
        return None
    name = given[0]
    value = body[name]
    if name == "response_format":
        return _response_format(value)
    if name == "json_schema":
        return json_schema_constraint(value, "json_schema", strict=True)
    return OutputConstraint(kind=name, source=_text(value, name), param=name)


def json_schema_constraint(schema: Any, param: str, *, strict: bool) -> OutputConstraint:
    """A JSON-schema constraint after the shape checks: an object, within the size and depth limits."""
    if not isinstance(schema, dict):
        raise invalid(param, "expected a JSON schema object.")
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise invalid(param, f"the schema is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are allowed.")
    source = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if len(source) > MAX_SCHEMA_CHARS:
        raise invalid(param, f"the schema is {len(source)} characters long; at most {MAX_SCHEMA_CHARS} are allowed.")
    return OutputConstraint(kind="json_schema", source=source, strict=strict, param=param)


def _is_text_format(name: str, value: Any) -> bool:
    """response_format {"type": "text"} asks for nothing."""
    return name == "response_format" and isinstance(value, dict) and value.get("type") == "text"


def _response_format(value: Any) -> OutputConstraint:
    """OpenAI's json_object / json_schema, and llama.cpp's response_format.schema."""
    if not isinstance(value, dict):
        raise invalid("response_format", "expected an object such as {\"type\": \"json_object\"}.")
    kind = value.get("type")
    if kind not in ("json_object", "json_schema"):
        raise invalid("response_format.type", "expected 'text', 'json_object' or 'json_schema'.")
    if value.get("schema") is not None:  # llama.cpp's extension, for either type
        return json_schema_constraint(value["schema"], "response_format.schema", strict=True)
    if kind == "json_object":
        return json_schema_constraint({"type": "object"}, "response_format", strict=True)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("response_format.json_schema", "expected an object with 'name' and 'schema'.")
    name = spec.get("name")  # OpenAI requires it; llama-server and its clients leave it out: only a label to us
    if name is not None and (not isinstance(name, str) or not SCHEMA_NAME.match(name)):
        raise invalid("response_format.json_schema.name",
                      "expected a name of 1 to 64 letters, digits, underscores or dashes.")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid("response_format.json_schema.strict", "expected a boolean.")
    schema = spec.get("schema", {"type": "object"})  # OpenAI: no schema means any JSON object
    # strict false only relaxes what we cannot enforce: unsupported keywords are ignored instead of refused
    return json_schema_constraint(schema, "response_format.json_schema.schema", strict=strict is not False)


def _text(value: Any, param: str) -> str:
    """A non-empty grammar or regex within the size limit."""
    if not isinstance(value, str) or not value.strip():
        raise invalid(param, "expected a non-empty string.")
    if len(value) > MAX_GRAMMAR_CHARS:
        raise invalid(param, f"{len(value)} characters long; at most {MAX_GRAMMAR_CHARS} are allowed.")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of objects and arrays (iterative, so a hostile schema cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_SCHEMA_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
