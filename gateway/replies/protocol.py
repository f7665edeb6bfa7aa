"""OpenAI request validation for chat completions, completions and embeddings (hand-written, no pydantic).

Each parse_* function takes the decoded JSON object and returns a typed request, or raises a 400
InvalidRequest that names the offending `param`. Unknown fields are ignored, as OpenAI does; known
fields llmfleet cannot honour (non-text content, suffix, best_of > 1, dimensions, the legacy functions) are
refused rather than silently ignored. Structured output (response_format and llama.cpp's json_schema,
grammar, regex) is read by gateway/replies/structured.py, tools and tool_choice by gateway/replies/tools.py. Extensions
beyond OpenAI: top_k, min_p, repetition_penalty, ignore_eos, priority, cache_prompt, lora (gateway/cluster/loras.py). Only OpenAI's
documented limits are checked here (temperature, top_p, penalties, logit_bias, top_logprobs, ...); the
ranges of the extensions (top_k, min_p, repetition_penalty) are checked once, by the engine's
SamplingParams.validate in the worker, which answers with a 400 error event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.cluster.loras import parse_loras, split_model
from gateway.http.fields import (
    boolean,
    choice,
    integer,
    invalid,
    is_number,
    keep_alive_seconds,
    metadata,
    number,
    string,
    text_within,
    token_ids,
)
from gateway.http.tenants import note_requested
from gateway.replies.reasoning import ThinkingSwitch, parse_reasoning_format, parse_thinking_switch
from gateway.replies.structured import parse_constraint
from gateway.replies.tools import MAX_CALL_TEXT_BYTES, ToolOptions, parse_tool_calls, parse_tools
from shared.errors import InvalidRequest
from shared.messages import PRIORITIES_LOW_TO_HIGH, ChatMessage, LoraRef, OutputConstraint, Sampling
from shared.settings import Settings

ROLES = ("system", "developer", "user", "assistant", "tool")
# Bounds on the free-text fields besides the prompt (max_prompt_chars) and tools (gateway/replies/tools.py); the OpenAPI
# document (gateway/admin/openapi.py) states these same constants.
MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_STOP_BYTES = 1024  # one stop sequence, UTF-8 (the worker holds back as much output as the longest one)
MAX_LOGIT_BIAS_ENTRIES = 1024  # entries in one logit_bias (each bias's size: LOGIT_BIAS_RANGE)
MAX_TOKEN_ID_DIGITS = 10  # a logit_bias key: a token id in decimal
MAX_MODEL_NAME = 256
MAX_USER_CHARS = 256  # `user`
MAX_NAME_BYTES = 256  # messages[].name
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Sampling ranges, each written once: OpenAI's documented ones are checked here, the extensions' (min_p,
# repetition_penalty) by the engine (worker/engine/decode/sampling.py; tests/gateway/openai/test_ranges.py compares).
TEMPERATURE_RANGE = (0.0, 2.0)
TOP_P_RANGE = (0.0, 1.0)  # the low end open: top_p 0 keeps no token
PENALTY_RANGE = (-2.0, 2.0)  # presence_penalty, frequency_penalty
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # one token's bias
MIN_P_RANGE = (0.0, 1.0)  # the engine's
REPETITION_PENALTY_RANGE = (0.01, 100.0)  # the engine's
INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class CompletionOptions:
    """What chat and text completions share."""

    model: str
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    sampling: Sampling
    stop: list[str]
    ignore_eos: bool
    priority: str
    cache_prompt: bool
    constraint: OutputConstraint | None = None  # structured output, compiled by the worker
    timings: bool = False  # llama-server's timings_per_token: the response (last chunk) carries `timings`
    loras: tuple[LoraRef, ...] = ()  # LoRA adapters: from `model: "<base>:<adapter>"` and the `lora` field
    keep_alive: float | None = None  # Ollama's keep_alive, on every API: how long the warm pool keeps the model


@dataclass(frozen=True)
class ChatRequest:
    """A validated /v1/chat/completions request."""

    params: CompletionOptions
    messages: list[ChatMessage]
    logprobs: bool
    top_logprobs: int | None
    tools: ToolOptions = ToolOptions()
    reasoning: bool = False  # split a thinking block off the answer (reasoning_format / LLMFLEET_REASONING_FORMAT)
    thinking: ThinkingSwitch = ThinkingSwitch({})  # chat_template_kwargs (enable_thinking), thinking budget


@dataclass(frozen=True)
class CompletionRequest:
    """A validated /v1/completions request; one job per prompt."""

    params: CompletionOptions
    prompts: list[str] | list[list[int]]
    logprobs: int | None
    echo: bool


@dataclass(frozen=True)
class EmbedBody:
    """A validated /v1/embeddings request."""

    model: str
    inputs: list[str] | list[list[int]]
    encoding_format: Literal["float", "base64"]
    priority: str = "normal"
    normalize: bool = True  # unit-length vectors (Ollama's legacy /api/embeddings returns them as pooled)
    keep_alive: float | None = None  # as CompletionOptions.keep_alive


def parse_chat(body: dict[str, Any], settings: Settings) -> ChatRequest:
    """Validate a chat completions body."""
    tools = parse_tools(body)
    messages = parse_messages(body.get("messages"), settings)
    logprobs = boolean(body, "logprobs", False)
    top_logprobs = integer(body, "top_logprobs", None, 0, 20)
    if top_logprobs is not None and not logprobs:
        raise invalid("top_logprobs", "top_logprobs requires logprobs to be true.")
    max_tokens = integer(body, "max_completion_tokens", None, 1, settings.max_tokens_limit)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", None, 1, settings.max_tokens_limit)
    params = _generation(body, settings, max_tokens=max_tokens, choices_per_n=1)
    if tools.active and params.constraint is not None:
        params = _constraint_beside_tools(params, tools)
    reasoning = parse_reasoning_format(body, settings.reasoning_format)
    return ChatRequest(params=params, messages=messages, logprobs=logprobs, top_logprobs=top_logprobs, tools=tools,
                       reasoning=reasoning, thinking=parse_thinking_switch(body, max_tokens))


def _constraint_beside_tools(params: CompletionOptions, tools: ToolOptions) -> CompletionOptions:
    """An output constraint beside active tools: left unapplied where a call is forced, else refused."""
    assert params.constraint is not None
    if tools.forced:
        return replace(params, constraint=None)
    raise invalid(params.constraint.param.split(".")[0], "an output constraint cannot be combined with tools unless "
                  "tool_choice is 'none', 'required' or a named function.")


def parse_completion(body: dict[str, Any], settings: Settings) -> CompletionRequest:
    """Validate a (legacy) completions body."""
    prompts = _prompts(body.get("prompt"), settings)
    if body.get("suffix"):
        raise invalid("suffix", "suffix (insertion) is not supported.")
    best_of = integer(body, "best_of", None, 1, settings.max_n)
    if best_of is not None and best_of != integer(body, "n", 1, 1, settings.max_n):
        raise invalid("best_of", "best_of must equal n (server-side best-of is not supported).")
    logprobs = integer(body, "logprobs", None, 0, 5)
    echo = boolean(body, "echo", False)
    max_tokens = integer(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, 0, settings.max_tokens_limit)
    params = _generation(body, settings, max_tokens=max_tokens, choices_per_n=len(prompts))
    return CompletionRequest(params=params, prompts=prompts, logprobs=logprobs, echo=echo)


def parse_embeddings(body: dict[str, Any], settings: Settings) -> EmbedBody:
    """Validate an embeddings body."""
    model = _model(body)
    if body.get("dimensions") is not None:
        raise invalid("dimensions", "changing the embedding size is not supported; omit dimensions.")
    encoding_format = choice(body, "encoding_format", ("float", "base64"), "float")
    value = body.get("input")
    if value is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    inputs = _string_or_token_lists(value, "input", settings, limit=settings.max_embed_inputs)
    return EmbedBody(model=model, inputs=inputs, encoding_format=encoding_format,  # type: ignore[arg-type]
                     priority=choice(body, "priority", PRIORITIES_LOW_TO_HIGH, "normal"),
                     keep_alive=keep_alive_seconds(body))


def _model(body: dict[str, Any]) -> str:
    model = string(body, "model", max_len=MAX_MODEL_NAME)
    if not model.strip():
        raise invalid("model", "must not be empty.")
    return model


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    """stream_options.include_usage (stream_options only with stream: true)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options", "stream_options is only allowed when stream is true.")
    if not isinstance(options, dict):
        raise invalid("stream_options", "expected an object.")
    return boolean(options, "include_usage", False)


def _sampling(body: dict[str, Any]) -> Sampling:
    """The sampling fields: OpenAI's documented limits here; the extensions' ranges are the engine's to check."""
    top_k = integer(body, "top_k", 0, *INT64)
    return Sampling(
        temperature=number(body, "temperature", 1.0, *TEMPERATURE_RANGE),
        top_p=number(body, "top_p", 1.0, *TOP_P_RANGE, lo_open=True),
        top_k=0 if top_k == -1 else top_k,  # -1 means off, as in llama.cpp
        min_p=number(body, "min_p", 0.0, -math.inf, math.inf),
        repetition_penalty=number(body, "repetition_penalty", 1.0, -math.inf, math.inf),
        presence_penalty=number(body, "presence_penalty", 0.0, *PENALTY_RANGE),
        frequency_penalty=number(body, "frequency_penalty", 0.0, *PENALTY_RANGE),
        logit_bias=_logit_bias(body.get("logit_bias")),
        seed=integer(body, "seed", None, *INT64),
    )


def _generation(
    body: dict[str, Any], settings: Settings, *, max_tokens: int | None, choices_per_n: int
) -> CompletionOptions:
    model, adapter = split_model(_model(body))
    loras = tuple(parse_loras(body, adapter))
    n = integer(body, "n", 1, 1, settings.max_n)
    if n * choices_per_n > settings.max_n:
        raise invalid("n", f"n times the number of prompts must be at most {settings.max_n}.")
    stream = boolean(body, "stream", False)
    include_usage = _include_usage(body, stream)
    sampling = _sampling(body)
    note_requested(string(body, "user", default="", max_len=MAX_USER_CHARS))  # the tenant, with keys off
    metadata(body)
    return CompletionOptions(
        model=model,
        max_tokens=max_tokens,
        n=n,
        stream=stream,
        include_usage=include_usage,
        sampling=sampling,
        stop=_stop(body.get("stop")),
        ignore_eos=boolean(body, "ignore_eos", False),
        priority=choice(body, "priority", PRIORITIES_LOW_TO_HIGH, "normal"),
        cache_prompt=boolean(body, "cache_prompt", True),
        constraint=parse_constraint(body),
        timings=boolean(body, "timings_per_token", False),
        loras=loras,
        keep_alive=keep_alive_seconds(body),
    )


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", "expected a non-empty string or an array of non-empty strings.")
    if len(stops) > MAX_STOP:
        raise invalid("stop", f"at most {MAX_STOP} stop sequences are allowed.")
    for stop in stops:
        text_within(stop, "stop", max_bytes=MAX_STOP_BYTES)
    return list(stops)


def _logit_bias(value: Any) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("logit_bias", "expected an object mapping token ids to biases.")
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise invalid("logit_bias", f"at most {MAX_LOGIT_BIAS_ENTRIES} entries are allowed.")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
            raise invalid("logit_bias", f"key {key!r} is not a token id.")
        low, high = LOGIT_BIAS_RANGE
        if not is_number(amount) or not low <= amount <= high:
            raise invalid("logit_bias", f"the bias of token {key} must be a number between {low:g} and {high:g}.")
        bias[int(key)] = float(amount)
    return bias


def parse_messages(value: Any, settings: Settings) -> list[ChatMessage]:
    """Validate a chat request's messages (roles, content parts, tool calls, total size)."""
    if value is None:
        raise InvalidRequest("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(value, list) or not value:
        raise invalid("messages", "expected a non-empty array of messages.")
    messages = [_message(item, f"messages[{i}]") for i, item in enumerate(value)]
    if sum(len(m.content) + len(m.reasoning or "") for m in messages) > settings.max_prompt_chars:
        raise invalid("messages", f"the messages are longer than {settings.max_prompt_chars} characters in all.")
    return messages


def _message(item: Any, param: str) -> ChatMessage:
    if not isinstance(item, dict):
        raise invalid(param, "expected an object with 'role' and 'content'.")
    role = item.get("role")
    if role not in ROLES:
        raise invalid(f"{param}.role", f"expected one of {', '.join(map(repr, ROLES))}.")
    tool_calls = parse_tool_calls(item["tool_calls"], f"{param}.tool_calls") if item.get("tool_calls") else None
    if tool_calls and role != "assistant":
        raise invalid(f"{param}.tool_calls", "only assistant messages carry tool_calls.")
    tool_call_id = item.get("tool_call_id")
    if role == "tool" and not isinstance(tool_call_id, str):
        raise invalid(f"{param}.tool_call_id", "a tool message needs the id of the call it answers.")
    if role == "tool":
        text_within(tool_call_id, f"{param}.tool_call_id", max_bytes=MAX_CALL_TEXT_BYTES)
    reasoning = _past_reasoning(item, param) if role == "assistant" else None
    content = item.get("content")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):
        content = "\n".join(_text_part(part, f"{param}.content[{i}]") for i, part in enumerate(content))
    if not isinstance(content, str):
        raise invalid(f"{param}.content", "expected a string or an array of text parts.")
    name = item.get("name")
    if name is not None:
        text_within(name, f"{param}.name", max_bytes=MAX_NAME_BYTES)
    return ChatMessage(role=role, content=content, name=name, tool_calls=tool_calls,
                       tool_call_id=tool_call_id if role == "tool" else None, reasoning=reasoning)


def _past_reasoning(item: dict[str, Any], param: str) -> str | None:
    """An assistant turn's earlier reasoning, under DeepSeek's `reasoning_content` (llama-server's name, which wins)
    or vLLM's `reasoning` (each a string or null). Only a harmony template (gpt-oss) puts it into the prompt, where
    the turn made tool calls, as llama-server does; other templates never see it."""
    found = None
    for name in ("reasoning_content", "reasoning"):
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            raise invalid(f"{param}.{name}", "expected a string (the turn's reasoning text) or null.")
        if value is not None and found is None:
            found = value
    return found


def _text_part(part: Any, param: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text":
        raise invalid(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported.")
    text = part.get("text")
    if not isinstance(text, str):
        raise invalid(f"{param}.text", "expected a string.")
    return text


def _prompts(value: Any, settings: Settings) -> list[str] | list[list[int]]:
    if value is None:
        raise InvalidRequest("Missing required parameter: 'prompt'.", param="prompt")
    return _string_or_token_lists(value, "prompt", settings, limit=settings.max_n, allow_empty_string=True)


def _string_or_token_lists(
    value: Any, param: str, settings: Settings, *, limit: int, allow_empty_string: bool = False
) -> list[str] | list[list[int]]:
    """A string, an array of strings, an array of token ids or an array of token-id arrays."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        items = [token_ids(value, param)]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise invalid(param, "expected a string, an array of strings, or an array of token-id arrays.")
    if len(items) > limit:
        raise invalid(param, f"at most {limit} inputs are allowed per request.")
    if all(isinstance(v, str) for v in items):
        if not allow_empty_string and not all(items):
            raise invalid(param, "inputs must not be empty strings.")
        if sum(len(v) for v in items) > settings.max_prompt_chars:
            raise invalid(param, f"longer than {settings.max_prompt_chars} characters in all.")
        return items
    if all(isinstance(v, list) for v in items):
        lists = [token_ids(v, f"{param}[{i}]") for i, v in enumerate(items)]
        if sum(len(v) for v in lists) > settings.max_prompt_chars:
            raise invalid(param, f"more than {settings.max_prompt_chars} tokens in all.")
        return lists
    raise invalid(param, "do not mix strings and token-id arrays.")

