"""Responses API request fields, defaults and limits, read in one place (hand-written, no pydantic).

A /v1/responses body becomes the same ChatRequest a /v1/chat/completions body does (gateway/replies/protocol.py reads
the shared fields and limits), as the Anthropic route does, so both make the same jobs:
- input: a string (one user message) or items: messages {role user | system | developer | assistant, content a
  string or parts input_text / output_text (refusal parts count as text)}, function_call {call_id, name,
  arguments} and function_call_output {call_id, output}; item_reference {id} (an item of a stored response,
  gateway/responses_api/items.py); reasoning {content reasoning_text parts, else summary summary_text parts}: its
  text becomes the reasoning of the assistant turn it opens or follows, as llama-server maps it (only a harmony
  template renders it; one without text, encrypted only, is dropped); images, files, audio and other item types
  are refused with a 400 naming the item.
- instructions: a system message before everything (not carried over by previous_response_id, as OpenAI's).
- tools: function tools in the flat Responses shape {type: function, name, description, parameters, strict};
  tool_choice none | auto | required | {type: function, name}; parallel_tool_calls.
- text.format: text | json_object | json_schema {name, schema, strict}: the structured-output constraint.
- max_output_tokens, temperature, top_p, and llmfleet's sampling extensions (seed, top_k, min_p, penalties,
  logit_bias, stop, priority, cache_prompt, lora, ignore_eos) and thinking switches (chat_template_kwargs,
  thinking_budget_tokens) as chat completions read them.
- metadata (at most 16 string pairs), store (default true), previous_response_id, stream, background.
- reasoning.effort: chat completions' reasoning_effort, as llama-server maps it (gpt-oss's template writes it;
  "none" turns thinking off); reasoning.summary is ignored.
Unknown fields are ignored, as OpenAI does (include, truncation, service_tier, user, ...).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.http.fields import boolean, integer, invalid, string
from gateway.replies.protocol import ChatRequest, parse_chat
from gateway.replies.structured import SCHEMA_NAME, json_schema_constraint
from gateway.responses_api.items import reference_id
from shared.errors import InvalidRequest
from shared.messages import OutputConstraint
from shared.settings import Settings

MAX_INPUT_ITEMS = 4096
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_INSTRUCTIONS_CHARS = 256 * 1024
RESPONSE_ID = re.compile(r"^resp_[A-Za-z0-9]{1,64}$")
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
UNSUPPORTED_PARTS = ("input_image", "input_file", "input_audio")
UNSUPPORTED_ITEMS = ("file_search_call", "web_search_call", "computer_call",
                     "computer_call_output", "image_generation_call", "code_interpreter_call", "local_shell_call",
                     "local_shell_call_output", "mcp_call", "mcp_list_tools", "mcp_approval_request",
                     "mcp_approval_response", "custom_tool_call", "custom_tool_call_output")
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "logit_bias", "stop", "priority", "cache_prompt", "lora", "ignore_eos",
                   "parallel_tool_calls", "chat_template_kwargs", "thinking_budget_tokens")
REFUSED_FIELDS = {"conversation": "conversations are not supported; chain responses with previous_response_id.",
                  "prompt": "reusable prompt templates are not supported; send input and instructions."}
_CHAT_NAMES = [(re.compile(r"(tools\[\d+\])\.function\."), r"\1."),  # chat field names -> Responses ones
               (re.compile(r"\breasoning_effort\b"), "reasoning.effort")]


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated /v1/responses request, before its history (previous_response_id) is loaded."""

    model: str
    items: list[dict[str, Any]]  # the new input items, in the canonical shape stored with the response
    chat_fields: dict[str, Any]  # the chat completions fields it means, all but messages
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    constraint: OutputConstraint | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # as the response object echoes them
    tool_choice: Any = "auto"
    max_output_tokens: int | None = None


def parse_request(body: dict[str, Any], settings: Settings) -> ResponsesRequest:
    """Validate a /v1/responses body (everything that does not need the stored history)."""
    for name, why in REFUSED_FIELDS.items():
        if body.get(name) is not None:
            raise invalid(name, why)
    model = string(body, "model", max_len=256)
    instructions = string(body, "instructions", default=None, max_len=MAX_INSTRUCTIONS_CHARS)
    previous = string(body, "previous_response_id", default=None, max_len=128)
    if previous is not None and not RESPONSE_ID.match(previous):
        raise invalid("previous_response_id", "expected a response id ('resp_...').")
    stream, background = boolean(body, "stream", False), boolean(body, "background", False)
    store = boolean(body, "store", True)
    if background and not store:
        raise invalid("store", "a background response must be stored (store: true) to be retrieved.")
    max_output = integer(body, "max_output_tokens", None, 1, settings.max_tokens_limit)
    tools = parse_tools(body.get("tools"))
    chat: dict[str, Any] = {"model": model, "stream": stream, "max_tokens": max_output}
    chat.update({name: body[name] for name in (*SAMPLING_FIELDS, "keep_alive") if body.get(name) is not None})
    if tools:
        chat["tools"] = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
                         for tool in tools]
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice)
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise invalid("reasoning", "expected an object such as {\"effort\": \"low\"}.")
    if reasoning is not None and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    text_format, constraint = parse_text_format(body.get("text"))
    return ResponsesRequest(
        model=model, items=parse_input(body.get("input")), chat_fields=chat, instructions=instructions,
        previous_response_id=previous, store=store, stream=stream, background=background,
        metadata=parse_metadata(body.get("metadata")), text_format=text_format, constraint=constraint,
        tools=tools, tool_choice=choice if choice is not None else "auto", max_output_tokens=max_output)


def chat_request(request: ResponsesRequest, history: list[dict[str, Any]], settings: Settings) -> ChatRequest:
    """The chat request of a Responses request whose earlier items (previous responses) are `history`."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages += to_messages([*history, *request.items])
    try:
        chat = parse_chat({**request.chat_fields, "messages": messages}, settings)
    except InvalidRequest as exc:
        raise _renamed(exc) from None
    if request.constraint is not None and not chat.tools.forced:  # a forced reply is calls only (see replies/tools)
        if chat.tools.active:
            raise invalid("text.format", "a JSON output format cannot be combined with tools unless tool_choice "
                                         "is 'none', 'required' or a named function.")
        chat = replace(chat, params=replace(chat.params, constraint=request.constraint))
    return chat


def _renamed(exc: InvalidRequest) -> InvalidRequest:
    """A chat-field error with the Responses field names (tools[i].name, not tools[i].function.name)."""
    message, param = exc.message, exc.param
    for pattern, replacement in _CHAT_NAMES:
        message = pattern.sub(replacement, message)
        param = pattern.sub(replacement, param) if param else param
    if param == "messages" or (param or "").startswith("messages["):
        param = "input"
        message = message.replace("messages", "input")
    return type(exc)(message, param=param)


def parse_input(value: Any) -> list[dict[str, Any]]:
    """`input` as canonical items: a string is one user message."""
    if value is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "expected a string or a non-empty array of input items.")
    if len(value) > MAX_INPUT_ITEMS:
        raise invalid("input", f"at most {MAX_INPUT_ITEMS} items are allowed.")
    items = [parse_item(item, f"input[{i}]") for i, item in enumerate(value)]
    return [item for item in items if item is not None]


def parse_item(item: Any, where: str) -> dict[str, Any] | None:
    """One input item in its canonical shape (with the id it came with, if any); None for an item the model
    does not read (reasoning); an item_reference stays one until the history is loaded (serving.prepare)."""
    if not isinstance(item, dict):
        raise invalid(where, "expected an input item object.")
    if item.get("type") == "item_reference":
        return {"type": "item_reference", "id": reference_id(item, where)}
    canonical = _canonical_item(item, where)
    if canonical is not None and item.get("id") is not None:
        canonical = {"id": reference_id(item, where), **canonical}
    return canonical


def _canonical_item(item: dict[str, Any], where: str) -> dict[str, Any] | None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return _message_item(item, where)
    if kind == "function_call":
        name, arguments = _text_field(item, "name", where), _text_field(item, "arguments", where)
        return {"type": "function_call", "call_id": _text_field(item, "call_id", where), "name": name,
                "arguments": arguments}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _parts_text(output, f"{where}.output")
        return {"type": "function_call_output", "call_id": _text_field(item, "call_id", where), "output": text}
    if kind == "reasoning":
        return _reasoning_item(item, where)
    if kind in UNSUPPORTED_ITEMS:
        raise invalid(f"{where}.type", f"{kind} items are not supported: llmfleet runs function tools only.")
    raise invalid(f"{where}.type", f"unknown item type {json.dumps(kind)} (supported: message, function_call, "
                                   "function_call_output, reasoning, item_reference).")


def _reasoning_item(item: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A reasoning item as its text (its reasoning_text content, else its summary) in the shape responses return;
    None when it carries none (an encrypted one)."""
    for name in ("content", "summary"):
        parts = item.get(name)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
            raise invalid(f"{where}.{name}", "expected an array of text parts.")
        if parts:
            text = "\n".join(part["text"] for part in parts)
            return {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
    return None


def _message_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise invalid(f"{where}.role", f"expected one of {', '.join(map(repr, MESSAGE_ROLES))}.")
    content = item.get("content")
    part_type = "output_text" if role == "assistant" else "input_text"
    text = content if isinstance(content, str) else _parts_text(content, f"{where}.content")
    return {"type": "message", "role": role, "content": [{"type": part_type, "text": text}]}


def _parts_text(parts: Any, where: str) -> str:
    """Text content parts joined with newlines (as chat completions joins text parts)."""
    if not isinstance(parts, list):
        raise invalid(where, "expected a string or an array of content parts.")
    texts = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_PARTS:
            raise invalid(f"{where}[{i}].type", f"{kind} parts are not supported: the models llmfleet serves read "
                                                "text only.")
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            continue
        if kind not in TEXT_PARTS:
            raise invalid(f"{where}[{i}].type", f"unknown content part type {json.dumps(kind)} (supported: "
                                                "input_text, output_text).")
        texts.append(_text_field(part, "text", f"{where}[{i}]"))
    return "\n".join(texts)


def _text_field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid(f"{where}.{name}", "expected a string.")
    return value


def to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical items as chat messages: function calls join the assistant turn they follow, and reasoning opens
    one (or joins the one it follows), as llama-server turns Responses input into chat messages."""
    messages: list[dict[str, Any]] = []
    for item in items:
        last = messages[-1] if messages else {}
        if item["type"] == "reasoning":
            text = "\n".join(part["text"] for part in item["content"])
            if last.get("role") == "assistant" and "reasoning_content" not in last:
                last["reasoning_content"] = text
            else:
                messages.append({"role": "assistant", "content": "", "reasoning_content": text})
        elif item["type"] == "message":
            text = "\n".join(part["text"] for part in item["content"])
            if item["role"] == "assistant" and last.get("role") == "assistant" and not last["content"] \
                    and "tool_calls" not in last:
                last["content"] = text  # the answer after its reasoning: one turn
            else:
                messages.append({"role": item["role"], "content": text})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def parse_tools(value: Any) -> list[dict[str, Any]]:
    """Function tools in the flat Responses shape (names and schemas are checked again by gateway/replies/tools.py)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools", "expected an array of tools.")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid(f"tools[{i}].type", f"{json.dumps(kind)}: only function tools ({{\"type\": \"function\", "
                                              "\"name\", \"parameters\"}) are supported.")
        out = {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
               "parameters": tool.get("parameters", {"type": "object", "properties": {}}),
               "strict": tool.get("strict", True)}
        tools.append(out)
    return tools


def _tool_choice(value: Any) -> Any:
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise invalid("tool_choice", "expected 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}.")


def parse_text_format(value: Any) -> tuple[dict[str, Any], OutputConstraint | None]:
    """`text.format`: the format the response echoes and the output constraint it means (None for text)."""
    if value is None:
        return {"type": "text"}, None
    if not isinstance(value, dict):
        raise invalid("text", "expected an object such as {\"format\": {\"type\": \"json_object\"}}.")
    spec = value.get("format")
    if spec is None:
        return {"type": "text"}, None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "text":
        return {"type": "text"}, None
    if kind == "json_object":
        return {"type": "json_object"}, json_schema_constraint({"type": "object"}, "text.format", strict=True)
    if kind != "json_schema":
        raise invalid("text.format.type", "expected 'text', 'json_object' or 'json_schema'.")
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.match(name):
        raise invalid("text.format.name", "expected a name of 1 to 64 letters, digits, underscores or dashes.")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid("text.format.strict", "expected a boolean.")
    if "schema" not in spec:
        raise InvalidRequest("Missing required parameter: 'text.format.schema'.", param="text.format.schema")
    constraint = json_schema_constraint(spec["schema"], "text.format.schema", strict=strict is not False)
    echo = {"type": "json_schema", "name": name, "schema": spec["schema"], "strict": bool(strict)}
    if isinstance(spec.get("description"), str):
        echo["description"] = spec["description"]
    return echo, constraint


def parse_metadata(value: Any) -> dict[str, str]:
    """At most 16 pairs of strings (keys up to 64 characters, values up to 512), as OpenAI allows."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("metadata", "expected an object of string keys and string values.")
    if len(value) > MAX_METADATA_PAIRS:
        raise invalid("metadata", f"at most {MAX_METADATA_PAIRS} pairs are allowed.")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS or not isinstance(item, str) or len(item) > MAX_METADATA_VALUE_CHARS:
            raise invalid(f"metadata.{key[:MAX_METADATA_KEY_CHARS]}",
                          f"keys are strings of at most {MAX_METADATA_KEY_CHARS} characters, values strings of "
                          f"at most {MAX_METADATA_VALUE_CHARS}.")
    return dict(value)
