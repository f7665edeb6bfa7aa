"""Anthropic Messages API requests (/v1/messages, /v1/messages/count_tokens) as the gateway's chat requests.

A body is translated into the OpenAI chat body the gateway already validates (gateway/replies/protocol.py, tools in
gateway/replies/tools.py), so both APIs make the same jobs and share every limit and check. Anthropic's own structure
(roles, content blocks, tools, tool_choice) is checked here first, with Anthropic's field paths in the messages:
- system: a string or text blocks; messages: user / assistant turns whose content is a string or blocks:
  text, tool_use (assistant), tool_result (user; becomes a tool turn, `is_error` results are prefixed "Error: "),
  thinking (assistant; its text goes back as the turn's reasoning, which only a harmony template renders;
  redacted_thinking is dropped). image and document blocks are refused (the served models read text only), as
  is a final assistant turn (prefill: the chat templates close every turn, so it could not be continued).
- max_tokens is required (not for count_tokens); temperature in [0, 1], top_p, top_k, stop_sequences, stream;
  output_config.format {type: json_schema, schema} is structured output (gateway/replies/structured.py);
  output_config.effort (low | medium | high) is the chat route's reasoning_effort.
- tools [{name, description, input_schema}] (Anthropic's server tools are refused); tool_choice {type: auto |
  any | tool (with name) | none, disable_parallel_tool_use}. thinking {type: disabled} renders the chat template
  with enable_thinking=false; {type: enabled, budget_tokens} with enable_thinking=true and closes the thinking
  block after budget_tokens (below max_tokens; any positive count, not Anthropic's 1024 minimum: small models).
  Unknown fields are ignored; metadata.user_id is bounded (MAX_USER_ID_BYTES) and names the tenant with keys off.
Text blocks of one turn are joined with a newline, as the OpenAI side joins text parts.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gateway.http.fields import bounded_int, invalid, is_number, text_within
from gateway.http.tenants import note_requested
from gateway.replies.protocol import MAX_STOP_BYTES, ChatRequest, parse_chat
from gateway.replies.tools import MAX_CALL_TEXT_BYTES
from shared.errors import InvalidRequest
from shared.settings import Settings

MAX_STOP_SEQUENCES = 16
MAX_USER_ID_BYTES = 256  # metadata.user_id
TEMPERATURE_RANGE = (0.0, 1.0)  # Anthropic's (OpenAI's is 0..2: gateway/replies/protocol.py)
UNSUPPORTED_BLOCKS = ("image", "document", "search_result", "container_upload")
EFFORTS = ("low", "medium", "high")  # output_config.effort


def parse_messages(body: dict[str, Any], settings: Settings, *, count_only: bool = False) -> ChatRequest:
    """Validate a /v1/messages body (or, with count_only, a count_tokens body) into the chat request it means."""
    chat = to_chat_body(body, settings, count_only=count_only)
    request = parse_chat(chat, settings)
    params = replace(request.params, stop=_stop_sequences(body.get("stop_sequences")))
    if count_only:  # the worker renders and tokenizes the prompt and generates nothing
        params = replace(params, max_tokens=0, stream=False)
    return replace(request, params=params)


def to_chat_body(body: dict[str, Any], settings: Settings, *, count_only: bool = False) -> dict[str, Any]:
    """The OpenAI chat completions body an Anthropic messages body means (stop_sequences are read separately)."""
    _metadata(body.get("metadata"))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body), "keep_alive": body.get("keep_alive")}
    if not count_only:
        if body.get("max_tokens") is None:
            raise InvalidRequest("max_tokens: Field required (the Messages API has no default).", param="max_tokens")
        chat["max_tokens"] = bounded_int(body["max_tokens"], "max_tokens", 1, settings.max_tokens_limit)
        for name in ("stream", "top_k"):
            if body.get(name) is not None:
                chat[name] = body[name]
        temperature = body.get("temperature")
        low, high = TEMPERATURE_RANGE
        if temperature is not None and not (is_number(temperature) and low <= temperature <= high):
            raise invalid("temperature", f"expected a number between {low:g} and {high:g}.")
        chat["temperature"] = temperature
        chat["top_p"] = body.get("top_p")
        if body.get("output_config") is not None:
            chat["response_format"] = _output_format(body["output_config"])
            chat["reasoning_effort"] = _effort(body["output_config"])
        if body.get("thinking") is not None:
            chat.update(_thinking(body["thinking"], chat["max_tokens"]))
    tools = _tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"])
        # Anthropic's default allows parallel calls (any included); only disable_parallel_tool_use turns them off
        chat["parallel_tool_calls"] = True if parallel is None else parallel
    return chat


def _thinking(value: Any, max_tokens: int) -> dict[str, Any]:
    """Anthropic's `thinking` as the chat body's chat_template_kwargs and thinking_budget_tokens."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    if kind != "enabled":
        raise invalid("thinking.type", "expected 'enabled' or 'disabled'.")
    if value.get("budget_tokens") is None:
        raise InvalidRequest("thinking.budget_tokens: Field required.", param="thinking.budget_tokens")
    budget = bounded_int(value["budget_tokens"], "thinking.budget_tokens", 1, max(max_tokens - 1, 1))
    if budget >= max_tokens:
        raise invalid("thinking.budget_tokens", f"must be below max_tokens ({max_tokens}).")
    return {"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget_tokens": budget}


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _text_blocks(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("messages: Field required.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "expected a non-empty array of messages.")
    for i, message in enumerate(messages):
        out.extend(_message(message, f"messages[{i}]"))
    if messages[-1].get("role") == "assistant":
        raise invalid(f"messages[{len(messages) - 1}]", "a final assistant message (prefill) is not supported; "
                                                         "end with a user message.")
    return out


def _text_blocks(value: Any, param: str) -> str:
    """A string, or an array of text blocks joined with newlines (system prompts, tool results)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(param, "expected a string or an array of text blocks.")
    texts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in UNSUPPORTED_BLOCKS:
                raise _unsupported(kind, f"{param}[{i}]")
            raise invalid(f"{param}[{i}]", "expected a text block ({\"type\": \"text\", \"text\": ...}).")
        texts.append(_string(block, "text", f"{param}[{i}]"))
    return "\n".join(texts)


def _message(item: Any, param: str) -> list[dict[str, Any]]:
    """One Anthropic turn as OpenAI messages: a user turn's tool results become tool turns, in block order."""
    if not isinstance(item, dict):
        raise invalid(param, "expected an object with 'role' and 'content'.")
    role = item.get("role")
    if role not in ("user", "assistant"):
        raise invalid(f"{param}.role", "expected 'user' or 'assistant' (a system prompt goes in 'system').")
    content = item.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{param}.content", "expected a string or an array of content blocks.")
    return _assistant_turn(content, param) if role == "assistant" else _user_turn(content, param)


def _assistant_turn(content: list[Any], param: str) -> list[dict[str, Any]]:
    """An assistant turn's blocks (text, thinking, tool_use) as one OpenAI assistant message."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for j, block in enumerate(content):
        where, kind = f"{param}.content[{j}]", _kind(block)
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            thoughts.append(_string(block, "thinking", where))
        elif kind == "redacted_thinking":
            continue  # encrypted by Anthropic: nothing a served model could read
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        else:
            raise _not_allowed(kind, where, "assistant", "text, tool_use, thinking")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    return [message]


def _user_turn(content: list[Any], param: str) -> list[dict[str, Any]]:
    """A user turn's blocks: its text, with each tool result a tool message between, in block order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        where, kind = f"{param}.content[{j}]", _kind(block)
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, where))
        else:
            raise _not_allowed(kind, where, "user", "text, tool_result")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _kind(block: Any) -> Any:
    """A content block's type (None for anything but an object)."""
    return block.get("type") if isinstance(block, dict) else None


def _not_allowed(kind: Any, where: str, role: str, allowed: str) -> InvalidRequest:
    """The error for a block the role may not hold: an unsupported kind (image, document, ...) says so."""
    if kind in UNSUPPORTED_BLOCKS:
        return _unsupported(kind, where)
    return invalid(f"{where}.type", f"{json.dumps(kind)} is not a block a {role} message may hold "
                                    f"(supported: {allowed}).")


def _unsupported(kind: str, where: str) -> InvalidRequest:
    return invalid(where, f"{kind} blocks are not supported: the models llmfleet serves read text only.")


def _string(block: dict[str, Any], name: str, where: str) -> str:
    value = block.get(name)
    if not isinstance(value, str):
        raise invalid(f"{where}.{name}", "expected a string.")
    return value


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An assistant's tool_use block as an OpenAI tool call (the arguments as JSON text)."""
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.id", "expected a non-empty string.")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name", "expected a non-empty string.")
    text_within(call_id, f"{where}.id", max_bytes=MAX_CALL_TEXT_BYTES)
    text_within(name, f"{where}.name", max_bytes=MAX_CALL_TEXT_BYTES)
    if not isinstance(arguments, dict):
        raise invalid(f"{where}.input", "expected an object.")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A user's tool_result block as an OpenAI tool turn."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.tool_use_id", "expected the id of the tool_use block this result answers.")
    text_within(call_id, f"{where}.tool_use_id", max_bytes=MAX_CALL_TEXT_BYTES)
    content = block.get("content")
    text = "" if content is None else _text_blocks(content, f"{where}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise invalid(f"{where}.is_error", "expected a boolean.")
    return {"role": "tool", "tool_call_id": call_id, "content": f"Error: {text}" if is_error else text}


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Anthropic's client tools as OpenAI function tools (names and schemas are checked by gateway/replies/tools.py)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid("tools", "expected an array of tools.")
    tools = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(where, "expected an object with 'name' and 'input_schema'.")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise invalid(f"{where}.type", f"{json.dumps(kind)}: only client tools (name, description, input_schema) "
                                           "are supported, not Anthropic's server tools.")
        if tool.get("input_schema") is None:
            raise InvalidRequest(f"{where}.input_schema: Field required.", param=f"{where}.input_schema")
        function = {"name": tool.get("name"), "description": tool.get("description") or "",
                    "parameters": tool["input_schema"]}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any) -> tuple[Any, bool | None]:
    """OpenAI's tool_choice and parallel_tool_calls (None: not given) for Anthropic's tool_choice."""
    if not isinstance(value, dict):
        raise invalid("tool_choice", "expected an object such as {\"type\": \"auto\"}.")
    disable = value.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise invalid("tool_choice.disable_parallel_tool_use", "expected a boolean.")
    parallel = None if disable is None else not disable
    kind = value.get("type")
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("tool_choice.name", "{\"type\": \"tool\"} needs the name of the tool to call.")
        return {"type": "function", "function": {"name": name}}, parallel
    choices = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in choices:
        raise invalid("tool_choice.type", "expected 'auto', 'any', 'tool' or 'none'.")
    return choices[kind], parallel


def _effort(value: Any) -> str | None:
    """output_config.effort (Anthropic's low | medium | high), as reasoning_effort; absent: None."""
    effort = value.get("effort") if isinstance(value, dict) else None
    if effort is not None and effort not in EFFORTS:
        raise invalid("output_config.effort", f"expected one of {', '.join(EFFORTS)}.")
    return effort


def _output_format(value: Any) -> dict[str, Any] | None:
    """OpenAI's response_format for output_config.format (structured output; effort is read by _effort)."""
    if not isinstance(value, dict):
        raise invalid("output_config", "expected an object.")
    output = value.get("format")
    if output is None:
        return None
    if not isinstance(output, dict) or output.get("type") != "json_schema":
        raise invalid("output_config.format", "expected {\"type\": \"json_schema\", \"schema\": {...}}.")
    if not isinstance(output.get("schema"), dict):
        raise invalid("output_config.format.schema", "expected a JSON schema object.")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": output["schema"], "strict": True}}


def _metadata(value: Any) -> None:
    """Anthropic's metadata: an object whose user_id, if any, is a string of at most MAX_USER_ID_BYTES."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid("metadata", "expected an object such as {\"user_id\": \"...\"}.")
    if value.get("user_id") is not None:
        text_within(value["user_id"], "metadata.user_id", max_bytes=MAX_USER_ID_BYTES)
        note_requested(value["user_id"])  # the tenant of fair shares, with keys off


def _stop_sequences(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise invalid("stop_sequences", "expected an array of non-empty strings.")
    if len(value) > MAX_STOP_SEQUENCES or any(len(s.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES for s in value):
        raise invalid("stop_sequences", f"at most {MAX_STOP_SEQUENCES} sequences of at most "
                                        f"{MAX_STOP_BYTES} bytes (UTF-8) each are allowed.")
    return list(value)
