"""Tool calling in the engine: tools and past calls in the prompt, and the grammar that holds calls to schema.

One canonical call format (Hermes / Qwen style), whatever the model, between the tags the caller gives
(CallTags; a worker passes the wire contract's, shared/tool_call_tags.py, which the engine does not import):
    <open tag>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    <close tag>
A chat template that renders tools itself in this format (probed once, as llama.cpp's minja does) gets the
tools and the call history as they are; any other template gets the tool list and one format instruction
in the system prompt, past calls as text and tool results as user turns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from worker.engine.errors import TemplateError
from worker.engine.text.chat_template import ChatTemplate
from worker.engine.text.constraints import JSON_WHITESPACE, Constraint, narrow_schema

ToolMode = Literal["auto", "required"]
_PROBE_TOOL, _PROBE_CALL, _PROBE_RESULT = "llmfleet_probe_tool", "llmfleet_probe_call", "llmfleet_probe_result"
INSTRUCTION = (
    "You can call the following tools (functions). Their signatures, as JSON schemas:\n{tools}\n\n"
    "To call tools, reply with one block per call and nothing after the calls, each block holding a JSON object "
    "with the tool's name and its arguments:\n"
    '{open}\n{"name": <function-name>, "arguments": <arguments-json-object>}\n{close}'
)


@dataclass(frozen=True)
class CallTags:
    """The tags around one tool call in a reply's text, as the caller's contract names them."""

    open: str
    close: str


@dataclass(frozen=True)
class Tool:
    """One function the model may call."""

    name: str
    description: str = ""
    parameters: str = '{"type":"object"}'  # a JSON schema, as JSON text
    strict: bool = True  # an unsupported schema keyword is an error (False: it is ignored)

    def openai(self) -> dict[str, Any]:
        """The tool as OpenAI (and Hugging Face chat templates) write it."""
        function = {"name": self.name, "description": self.description, "parameters": json.loads(self.parameters)}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolTemplateSupport:
    """What a chat template renders natively, in the canonical format."""

    tools: bool  # a `tools` list, with a <tool_call> format instruction
    history: bool  # assistant `tool_calls` and `tool` role messages


def probe(template: ChatTemplate, tags: CallTags) -> ToolTemplateSupport:
    """Render probe conversations to learn whether the template handles tools and tool history itself (in the
    format of `tags`)."""
    tool = Tool(_PROBE_TOOL, "probe", '{"type":"object","properties":{"x":{"type":"string"}}}')
    tools = _renders(template, [{"role": "user", "content": "hi"}], [tool.openai()], (_PROBE_TOOL, tags.open))
    call = {"id": "call_1", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {"x": "y"}}}
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "name": _PROBE_CALL, "content": _PROBE_RESULT}]
    return ToolTemplateSupport(tools, tools and _renders(template, history, [tool.openai()], (_PROBE_CALL, _PROBE_RESULT)))


def _renders(template: ChatTemplate, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
             needles: Sequence[str]) -> bool:
    """Whether rendering succeeds and shows every needle."""
    try:
        text = template.render(messages, tools=tools)
    except TemplateError:
        return False
    return all(needle in text for needle in needles)


def prepare_messages(messages: list[dict[str, Any]], tools: Sequence[Tool], support: ToolTemplateSupport,
                     tags: CallTags) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and the `tools` template variable for a conversation with tools (none: history only)."""
    if tools and support.tools:
        native = [native_message(m) for m in messages] if support.history else _as_text(messages, tags)
        return native, [t.openai() for t in tools]
    out = _as_text(messages, tags) if not support.history else [native_message(m) for m in messages]
    if tools:
        listing = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
        instruction = INSTRUCTION.replace("{open}", tags.open).replace("{close}", tags.close).replace("{tools}", listing)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instruction}"}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out, None


def _call_text(name: str, arguments: str, tags: CallTags) -> str:
    """One call in the canonical format (arguments kept as sent when they are JSON)."""
    try:
        json.loads(arguments)
    except ValueError:
        arguments = json.dumps(arguments)
    return f'{tags.open}\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n{tags.close}'


def native_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as Hugging Face templates expect it: tool calls in OpenAI's shape, arguments as objects."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    converted = []
    for call in calls:
        try:
            arguments = json.loads(call["arguments"])
        except ValueError:
            arguments = call["arguments"]
        converted.append({"id": call["id"], "type": "function",
                          "function": {"name": call["name"], "arguments": arguments}})
    return {**message, "tool_calls": converted}


def _as_text(messages: list[dict[str, Any]], tags: CallTags) -> list[dict[str, Any]]:
    """Past calls as canonical text in the assistant turn; tool results as user turns (adjacent ones joined)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = "\n".join(_call_text(c["name"], c["arguments"], tags) for c in message["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
            continue
        if role == "tool":
            result = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("tool_result"):
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{result}"}
            else:
                out.append({"role": "user", "content": result, "tool_result": True})
            continue
        out.append({k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")})
    return [{k: v for k, v in m.items() if k != "tool_result"} for m in out]


def call_schema(tools: Sequence[Tool]) -> dict[str, Any]:
    """The JSON schema of one call object: the name first, then arguments that match that tool's parameters."""
    variants = [{"type": "object", "properties": {"name": {"const": t.name},
                                                  "arguments": narrow_schema(json.loads(t.parameters))},
                 "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    lenient = not all(t.strict for t in tools)  # each strict tool was already compiled alone (unsupported = error)
    return {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE, "lenient": lenient}}


def call_grammar(tools: Sequence[Tool], mode: ToolMode, parallel: bool, tags: CallTags) -> Constraint:
    """The Lark grammar of a reply: only calls (required, or a named tool), or free text that switches to calls
    at the first open tag (auto: the text before it is free, the calls are held to their schemas)."""
    body = f'%json {json.dumps(call_schema(tools))} "\\n"? "{tags.close}"'
    more = f' ("\\n" "{tags.open}" call)*' if parallel else ""
    if mode == "required":
        start = f'start: "{tags.open}" call{more}'
    else:  # lazy: TEXT is any text without the trigger; `text` ends at it (and takes it)
        start = (f"start: text call{more} | TEXT\n"
                 f"TEXT: /(.|\\n)+/ & ~/(.|\\n)*{tags.open}(.|\\n)*/\n"
                 f'text[stop="{tags.open}"]: /(.|\\n)*/')
    return Constraint("lark", f'{start}\ncall: "\\n"? {body}\n')
