"""Tool-calling fields of a chat request: tools, tool_choice, parallel_tool_calls, and tool history in messages.

Shapes and sizes are checked here; each tool's parameters schema is compiled by the worker, which names
`tools[i].function.parameters` in a 400 when one does not compile (see gateway/replies/structured.py).

parallel_tool_calls left unset (or null) is true with tool_choice auto (OpenAI's default) and false where a
call is forced (required or a named function), as llama-server defaults it: a forced reply is one call and ends
there. A named function is always one call (the worker's grammar closes after it), whatever the field says.

An output format (response_format, the Responses API's text.format) governs a reply's text. With tool_choice auto
the reply may be either, so the two are refused together; with a forced call (required or a named function) the
reply is calls only, each held to its tool's schema, so the format has nothing to govern and is accepted and left
unapplied (instructor's Responses mode sends both, as OpenAI accepts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.http.fields import boolean, invalid, text_within
from gateway.replies.structured import SCHEMA_NAME, json_schema_constraint
from shared.messages import ToolCall, ToolChoice, ToolSpec

MAX_TOOLS = 128
MAX_DESCRIPTION_CHARS = 8192
MAX_ARGUMENTS_CHARS = 64 * 1024
MAX_CALL_TEXT_BYTES = 256  # a tool call's id (and a past call's function name), in UTF-8


@dataclass(frozen=True)
class ToolOptions:
    """What a request asks of tool calling."""

    tools: list[ToolSpec] = field(default_factory=list)
    choice: ToolChoice = "none"
    name: str | None = None  # the function a named tool_choice forces
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether the reply may hold tool calls (the gateway then parses them out of the text)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the reply must be calls only (tool_choice required or a named function)."""
        return bool(self.tools) and self.choice in ("required", "named")


def parse_tools(body: dict[str, Any]) -> ToolOptions:
    """tools, tool_choice and parallel_tool_calls; the legacy functions / function_call are refused."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise invalid(legacy, "the legacy function-calling fields are not supported; use tools and tool_choice.")
    tools = _tools(body.get("tools"))
    choice, name = _choice(body.get("tool_choice"), tools)
    parallel = boolean(body, "parallel_tool_calls", choice == "auto") and choice != "named"
    return ToolOptions(tools=tools, choice=choice, name=name, parallel=parallel)


def _tools(value: Any) -> list[ToolSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools", "expected an array of tools.")
    if len(value) > MAX_TOOLS:
        raise invalid("tools", f"at most {MAX_TOOLS} tools are allowed.")
    specs: list[ToolSpec] = []
    for i, item in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(item, dict) or item.get("type") != "function":
            raise invalid(f"{param}.type", "only function tools ({\"type\": \"function\", ...}) are supported.")
        function = item.get("function")
        if not isinstance(function, dict):
            raise invalid(f"{param}.function", "expected an object with a 'name'.")
        name = function.get("name")
        if not isinstance(name, str) or not SCHEMA_NAME.match(name):
            raise invalid(f"{param}.function.name", "expected a name of 1 to 64 letters, digits, underscores or dashes.")
        if any(spec.name == name for spec in specs):
            raise invalid(f"{param}.function.name", f"two tools are named {name!r}.")
        description = function.get("description") or ""
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
            raise invalid(f"{param}.function.description", f"expected a string of at most {MAX_DESCRIPTION_CHARS} characters.")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"{param}.function.strict", "expected a boolean.")
        schema = function.get("parameters", {"type": "object", "properties": {}})
        parameters = json_schema_constraint(schema, f"{param}.function.parameters", strict=strict is not False)
        specs.append(ToolSpec(name=name, description=description, parameters=parameters.source,
                              strict=parameters.strict))
    return specs


def _choice(value: Any, tools: list[ToolSpec]) -> tuple[ToolChoice, str | None]:
    if value is None:
        return ("auto" if tools else "none"), None
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise invalid("tool_choice", "'required' needs at least one tool in tools.")
        return value, None
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise invalid("tool_choice", "expected 'none', 'auto', 'required' or "
                                     "{\"type\": \"function\", \"function\": {\"name\": ...}}.")
    if not any(spec.name == name for spec in tools):
        raise invalid("tool_choice", f"no tool in tools is named {name!r}.")
    return "named", name


def parse_tool_calls(value: Any, param: str) -> list[ToolCall]:
    """The tool_calls of an assistant message in the history."""
    if not isinstance(value, list):
        raise invalid(param, "expected an array of tool calls.")
    calls = []
    for i, item in enumerate(value):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(item.get("id"), str):
            raise invalid(f"{param}[{i}]", "expected {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}.")
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise invalid(f"{param}[{i}].function.name", "expected a non-empty string.")
        text_within(name, f"{param}[{i}].function.name", max_bytes=MAX_CALL_TEXT_BYTES)
        text_within(item["id"], f"{param}[{i}].id", max_bytes=MAX_CALL_TEXT_BYTES)
        if not isinstance(arguments, str) or len(arguments) > MAX_ARGUMENTS_CHARS:
            raise invalid(f"{param}[{i}].function.arguments",
                          f"expected a JSON string of at most {MAX_ARGUMENTS_CHARS} characters.")
        calls.append(ToolCall(id=item["id"], name=name, arguments=arguments))
    return calls
