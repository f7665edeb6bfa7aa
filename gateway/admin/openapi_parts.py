"""The building blocks of the gateway's OpenAPI document (gateway/admin/openapi.py and the other APIs' entries in
openapi_other_apis.py): schema helpers and one operation's shape."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
Schema = dict[str, Any]


def ref(name: str) -> Schema:
    """A reference to a component schema."""
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """The schema, or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def object_schema(properties: dict[str, Schema], required: tuple[str, ...] = ()) -> Schema:
    """An object with these properties, of which `required` must be present."""
    return {"type": "object", "properties": properties, "required": list(required)}


ERRORS = {"400": "invalid request", "401": "missing or wrong API key", "404": "unknown model",
          "413": "body too large", "429": "queue full or rate limited", "503": "no worker or Redis away",
          "504": "deadline passed"}


def operation(summary: str, body: str | None, reply: str, *, stream: bool = False, tag: str = "openai",
              error: str = "Error", params: tuple[str, ...] = ()) -> Schema:
    """One operation: its body and 200 reply (components' schema names), errors in `error`'s shape, and its
    path parameters (strings); `tag` names the API it belongs to."""
    ok: Schema = {"description": "success", "content": {JSON: {"schema": ref(reply)}}}
    if stream:
        ok["content"]["text/event-stream"] = {"schema": object_schema(  # each event: a chunk's JSON, then "[DONE]"
            {"data": {"type": "string"}}, ("data",))}
    responses = {"200": ok, **{code: {"description": why, "content": {JSON: {"schema": ref(error)}}}
                               for code, why in ERRORS.items()}}
    found: Schema = {"summary": summary, "tags": [tag], "responses": responses}
    if body is not None:
        found["requestBody"] = {"required": True, "content": {JSON: {"schema": ref(body)}}}
    if params:
        found["parameters"] = [{"name": name, "in": "path", "required": True,
                                "schema": {"type": "string", "minLength": 1}} for name in params]
    return found


def resume_operation(summary: str, param: str = "stream_id", tag: str = "openai", error: str = "Error") -> Schema:
    """A GET that resumes a stream after its Last-Event-ID header (or ?starting_after=N): SSE events only."""
    found = operation(summary, None, "Object", stream=True, tag=tag, error=error, params=(param,))
    del found["responses"]["200"]["content"][JSON]
    found["parameters"] += [{"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "integer"}},
                            {"name": "starting_after", "in": "query", "required": False, "schema": {"type": "integer"}}]
    return found
