"""Ollama API request bodies (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/show) as the gateway's
requests: every Ollama field, default and limit is read here.

As gateway/anthropic/protocol.py does for the Messages API, a body is translated into the OpenAI body the gateway already
validates (gateway/replies/protocol.py, gateway/replies/tools.py, gateway/replies/structured.py), so both APIs make the same jobs and share
every limit; Ollama's own structure is checked here first, with Ollama's field names in the messages
(gateway/ollama/errors.py renames the OpenAI fields in errors raised later).
- options: temperature, top_p, top_k, min_p, num_predict (-1 and -2: up to the context), stop, seed,
  repeat_penalty, presence_penalty, frequency_penalty; num_ctx is checked against the model's context
  (gateway/ollama/serving.py). Ollama's load-time and sampler options llmfleet has no use for (num_gpu, mirostat,
  tfs_z, ...) are type-checked and ignored, as unknown names are (Ollama only logs those).
  Defaults are Ollama's: temperature 0.8, top_k 40, top_p 0.9 (repeat_penalty stays 1.0: the engine's penalty
  covers the whole context, not Ollama's last 64 tokens).
- format: "json" (any JSON object) or a JSON schema, onto the structured-output constraint path.
- tools: Ollama's tools are OpenAI function tools; assistant tool_calls carry `arguments` as an object, and a
  tool turn names its call by `tool_name` (ids are made up here, in order).
- think: true / false / "low" / "medium" / "high": the chat template gets enable_thinking (false, or true for the
  others, as the chat route's chat_template_kwargs), and a level is the chat route's reasoning_effort (gpt-oss's
  template writes it); a reply's reasoning is split into `thinking` (gateway/replies/reasoning.py, or
  gateway/replies/harmony.py for gpt-oss), except with false, which leaves it in the content. An assistant turn's
  `thinking` goes back as its reasoning (a harmony template renders it).
- keep_alive is read here (gateway/http/fields.py keep_alive_seconds) and travels in the request to the warm pool.
Images, suffix (insertion), template overrides and `context` (token history) are refused with a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.http.fields import invalid, is_int, is_number, keep_alive_seconds, text_within
from gateway.replies.protocol import (
    MAX_STOP_BYTES,
    ChatRequest,
    CompletionRequest,
    EmbedBody,
    parse_chat,
    parse_completion,
    parse_embeddings,
)
from shared.errors import InvalidRequest
from shared.settings import Settings

DEFAULTS: dict[str, float] = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}  # Ollama's, where a body has none
TO_OPENAI = {  # Ollama option -> the OpenAI field that carries it
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
    "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "num_predict": "max_tokens",
}
NUMBER_OPTIONS = frozenset({"temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                            "frequency_penalty", "tfs_z", "typical_p", "mirostat_tau", "mirostat_eta"})
INTEGER_OPTIONS = frozenset({"top_k", "seed", "num_predict", "num_ctx", "num_keep", "repeat_last_n", "mirostat",
                             "num_batch", "num_gpu", "main_gpu", "num_thread"})
BOOLEAN_OPTIONS = frozenset({"numa", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock",
                             "embedding_only", "penalize_newline"})
UNLIMITED_PREDICT = (-1, -2)  # Ollama: -1 until the model stops, -2 until the context is full
MAX_STOP = 16  # Ollama takes more stop sequences than OpenAI; each has the chat routes' byte bound
THINK_LEVELS = ("low", "medium", "high")
ROLES = ("system", "user", "assistant", "tool")
TAG_SUFFIX = ":latest"  # Ollama's default tag: "smollm2-135m:latest" is the model "smollm2-135m"


@dataclass(frozen=True)
class OllamaGeneration:
    """A validated /api/chat or /api/generate request."""

    kind: Literal["chat", "generate"]
    model: str  # the name the client sent (the replies carry it back)
    served_model: str  # the model the jobs go to
    stream: bool
    request: ChatRequest | CompletionRequest | None  # None: nothing to generate (the model is loaded or unloaded)
    num_ctx: int | None = None
    think: bool | str | None = None
    keep_alive: float | None = None  # how long the warm pool keeps the model (0: unload it now)


@dataclass(frozen=True)
class OllamaEmbedding:
    """A validated /api/embed (or, legacy, /api/embeddings) request."""

    model: str
    request: EmbedBody
    legacy: bool  # /api/embeddings: one prompt, one vector, not normalized


def served_name(model: Any) -> Any:
    """The model a name means: Ollama's default tag ':latest' is dropped (other tags name LoRA adapters)."""
    if isinstance(model, str) and model.endswith(TAG_SUFFIX):
        return model[: -len(TAG_SUFFIX)]
    return model


def model_name(body: dict[str, Any]) -> str:
    """The `model` of a body (older clients send `name`), required."""
    model = body.get("model", body.get("name"))
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("model is required", param="model")
    return model


def _reasoning_format(think: bool | str | None) -> dict[str, Any]:
    """Ollama's `think` onto the chat route's fields: false renders the template with enable_thinking=false and
    keeps a thinking block (if the model writes one anyway) in the content; true or a level renders it with
    enable_thinking=true and splits the block into `thinking`; absent leaves the template's default and the
    server's LLMFLEET_REASONING_FORMAT."""
    if think is None:
        return {}
    level = {"reasoning_effort": think} if isinstance(think, str) else {}
    return {"reasoning_format": "none" if think is False else "deepseek",
            "chat_template_kwargs": {"enable_thinking": think is not False}, **level}


def parse_chat_request(body: dict[str, Any], settings: Settings) -> OllamaGeneration:
    """Validate an /api/chat body."""
    model = model_name(body)
    keep_alive = keep_alive_seconds(body)
    messages = _messages(body.get("messages"))
    stream, think, options = _common(body)
    if not messages:  # Ollama: an empty chat loads the model (keep_alive 0 unloads it)
        return OllamaGeneration("chat", model, served_name(model), stream, None, think=think,
                                keep_alive=keep_alive)
    chat = {"model": served_name(model), "messages": messages, "stream": stream, **_sampling(options),
            **_reasoning_format(think)}
    if body.get("tools") is not None:
        chat["tools"] = body["tools"]
    chat.update(_format(body.get("format")))
    request = parse_chat(chat, settings)
    request = replace(request, params=replace(request.params, stop=_stop(options.get("stop")), keep_alive=keep_alive))
    return OllamaGeneration("chat", model, request.params.model, stream, request,
                            num_ctx=options.get("num_ctx"), think=think, keep_alive=keep_alive)


def parse_generate_request(body: dict[str, Any], settings: Settings) -> OllamaGeneration:
    """Validate an /api/generate body: a chat turn (system + prompt), or with `raw` the prompt as it is."""
    model = model_name(body)
    keep_alive = keep_alive_seconds(body)
    for name in ("suffix", "template"):
        if _string(body, name):
            raise invalid(name, f"{name} is not supported by llmfleet (the model's own chat template is used).")
    if body.get("context"):
        raise invalid("context", "token history is not supported; send the conversation to /api/chat.")
    if body.get("images"):
        raise invalid("images", "images are not supported: the models llmfleet serves read text only.")
    prompt, system = _string(body, "prompt"), _string(body, "system")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise invalid("raw", "expected a boolean.")
    stream, think, options = _common(body)
    if not prompt:  # Ollama: an empty prompt loads the model (keep_alive 0 unloads it)
        return OllamaGeneration("generate", model, served_name(model), stream, None, think=think,
                                keep_alive=keep_alive)
    openai = {"model": served_name(model), "stream": stream, **_sampling(options), **_format(body.get("format"))}
    request: ChatRequest | CompletionRequest
    if raw:  # the prompt is the model's input as it is, with no template
        request = parse_completion({**openai, "prompt": prompt}, settings)
        if openai.get("max_tokens") is None:  # /v1/completions' default of 16 is not Ollama's
            request = replace(request, params=replace(request.params, max_tokens=None))
    else:
        turns = [{"role": "system", "content": system}] if system else []
        request = parse_chat({**openai, "messages": [*turns, {"role": "user", "content": prompt}],
                              **_reasoning_format(think)}, settings)
    request = replace(request, params=replace(request.params, stop=_stop(options.get("stop")), keep_alive=keep_alive))
    return OllamaGeneration("generate", model, request.params.model, stream, request,
                            num_ctx=options.get("num_ctx"), think=think, keep_alive=keep_alive)


def parse_embed_request(body: dict[str, Any], settings: Settings, *, legacy: bool = False) -> OllamaEmbedding:
    """Validate an /api/embed body (`input`: a string or strings), or with legacy an /api/embeddings one
    (`prompt`: one string)."""
    model = model_name(body)
    keep_alive = keep_alive_seconds(body)
    _options(body.get("options"))
    if body.get("dimensions") is not None:
        raise invalid("dimensions", "changing the embedding size is not supported; omit dimensions.")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise invalid("truncate", "expected a boolean.")
    name = "prompt" if legacy else "input"
    value = body.get(name)
    if value is None:
        raise InvalidRequest(f"{name} is required", param=name)
    if legacy and not isinstance(value, str):
        raise invalid("prompt", "expected a string.")
    if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
        raise invalid("input", "expected a string or an array of strings.")
    request = parse_embeddings({"model": served_name(model), "input": value}, settings)
    return OllamaEmbedding(model, replace(request, normalize=not legacy, keep_alive=keep_alive), legacy)


def _common(body: dict[str, Any]) -> tuple[bool, bool | str | None, dict[str, Any]]:
    """stream (Ollama streams unless told not to), think, and the checked options."""
    stream = body.get("stream", True)
    if stream is None:
        stream = True
    if not isinstance(stream, bool):
        raise invalid("stream", "expected a boolean.")
    think = body.get("think")
    if think is not None and not isinstance(think, bool) and think not in THINK_LEVELS:
        raise invalid("think", f"expected a boolean or one of {', '.join(THINK_LEVELS)}.")
    if body.get("logprobs"):
        raise invalid("logprobs", "log probabilities are not served on the Ollama API; use /v1/chat/completions.")
    return stream, think, _options(body.get("options"))


def _options(value: Any) -> dict[str, Any]:
    """The options object with every known option's type checked (integers given as 40.0 become 40)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("options", "expected an object.")
    options: dict[str, Any] = {}
    for name, option in value.items():
        if option is None:
            continue
        param = f"options.{name}"
        if name in NUMBER_OPTIONS and not is_number(option):
            raise invalid(param, f"expected a number, got {json.dumps(option)}.")
        if name in INTEGER_OPTIONS:
            if not (is_int(option) or (is_number(option) and float(option).is_integer())):
                raise invalid(param, f"expected an integer, got {json.dumps(option)}.")
            option = int(option)
        if name in BOOLEAN_OPTIONS and not isinstance(option, bool):
            raise invalid(param, f"expected a boolean, got {json.dumps(option)}.")
        options[name] = option
    if "num_ctx" in options and options["num_ctx"] < 1:
        raise invalid("options.num_ctx", "expected a positive number of tokens.")
    return options


def _sampling(options: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI sampling fields the options mean, Ollama's defaults filled in."""
    fields: dict[str, Any] = dict(DEFAULTS)
    for name, field in TO_OPENAI.items():
        if name in options:
            fields[field] = options[name]
    predict = options.get("num_predict")
    if predict in UNLIMITED_PREDICT:
        fields.pop("max_tokens")
    elif predict is not None and predict < 1:
        raise invalid("options.num_predict", f"{predict} is out of range; use a positive count, or -1 for no limit.")
    return fields


def _stop(value: Any) -> list[str]:
    """options.stop: a string or an array of strings (Ollama allows more than OpenAI's four)."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("options.stop", "expected an array of non-empty strings.")
    if len(stops) > MAX_STOP:
        raise invalid("options.stop", f"at most {MAX_STOP} stop sequences are allowed.")
    return [text_within(stop, "options.stop", max_bytes=MAX_STOP_BYTES) for stop in stops]


def _format(value: Any) -> dict[str, Any]:
    """OpenAI's response_format for Ollama's format: "json" (any JSON object) or a JSON schema object."""
    if value is None or value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if not isinstance(value, dict):
        raise invalid("format", "expected \"json\" or a JSON schema object.")
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}}


def _string(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid(name, "expected a string.")
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI messages: tool calls get ids, and each tool turn the id of the call it answers
    (the earliest unanswered call of its tool_name, else the earliest unanswered one)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("messages", "expected an array of messages.")
    ids = _CallIds()
    return [_message(item, f"messages[{i}]", ids) for i, item in enumerate(value)]


class _CallIds:
    """The ids of a conversation's tool calls, in order, and which of them no tool turn answered yet."""

    def __init__(self) -> None:
        self.made = 0
        self.unanswered: list[tuple[str, str]] = []  # (id, name)

    def issue(self, name: str) -> str:
        """A new call's id."""
        self.made += 1
        self.unanswered.append((f"call_{self.made}", name))
        return f"call_{self.made}"

    def answer(self, name: Any) -> str:
        """The id a tool turn for `name` answers: its tool's earliest unanswered call, else the earliest one, else
        a new id."""
        match = next((c for c in self.unanswered if c[1] == name), self.unanswered[0] if self.unanswered else None)
        if match is None:
            self.made += 1
            return f"call_{self.made}"
        self.unanswered.remove(match)
        return match[0]


def _message(item: Any, where: str, ids: _CallIds) -> dict[str, Any]:
    """One Ollama message as an OpenAI message."""
    if not isinstance(item, dict):
        raise invalid(where, "expected an object with 'role' and 'content'.")
    role = item.get("role")
    if role not in ROLES:
        raise invalid(f"{where}.role", f"expected one of {', '.join(ROLES)}.")
    if item.get("images"):
        raise invalid(f"{where}.images", "images are not supported: the models llmfleet serves read text only.")
    message: dict[str, Any] = {"role": role, "content": _string(item, "content")}
    if role == "assistant" and item.get("thinking") is not None:
        message["reasoning_content"] = _string(item, "thinking")
    if item.get("tool_calls"):
        if role != "assistant":
            raise invalid(f"{where}.tool_calls", "only assistant messages carry tool_calls.")
        message["tool_calls"] = [
            {"id": ids.issue(name), "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
            for name, arguments in _tool_calls(item["tool_calls"], f"{where}.tool_calls")]
    if role == "tool":
        message["tool_call_id"] = ids.answer(item.get("tool_name", item.get("name")))
    return message


def _tool_calls(value: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments object) of an assistant's tool_calls."""
    if not isinstance(value, list):
        raise invalid(where, "expected an array of tool calls.")
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}[{i}].function.name", "expected a non-empty string.")
        arguments = function.get("arguments") or {}  # type: ignore[union-attr]
        if isinstance(arguments, str):  # some clients send the JSON text, as OpenAI's API has it
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(arguments, dict):
            raise invalid(f"{where}[{i}].function.arguments", "expected an object.")
        calls.append((name, arguments))
    return calls
