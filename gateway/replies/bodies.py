"""OpenAI response and chunk bodies, in exactly OpenAI's shapes (plain dicts, ready for JSON)."""

from __future__ import annotations

import base64
import codecs
import sys
from array import array
from dataclasses import dataclass
from typing import Any

from gateway.cluster.loras import adapters_of
from gateway.replies.reasoning import BOTH_FIELDS, Reasoning
from gateway.replies.tool_calls import CallStart, Item
from shared.messages import Timing, TokenLogprob, Usage
from shared.registry import RegistryEntry

SYSTEM_FINGERPRINT = "fp_llmfleet"
OWNED_BY = "llmfleet"


@dataclass
class ChoiceResult:
    """One finished choice, as collected from its events."""

    index: int
    text: str | None = ""  # None: a reply of tool calls only
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    tool_calls: list[dict[str, str]] | None = None  # {"id", "name", "arguments"} parsed out of the text
    reasoning: str | None = None  # the thinking block's text, split off the answer (None: no block, or not split)
    stop_sequence: str | None = None  # the stop string that ended the choice, if one did
    dropped_calls: int = 0  # tool calls begun but not returned (cut short by max_tokens)


def _message(choice: ChoiceResult, reasoning_keys: tuple[str, ...] = BOTH_FIELDS) -> dict[str, Any]:
    """A chat choice's message, with its reasoning under each of `reasoning_keys` and tool_calls when it made any."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.reasoning is not None:
        message.update(dict.fromkeys(reasoning_keys, choice.reasoning))
    if choice.tool_calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for c in choice.tool_calls]
    return message


def part_delta(part: Reasoning | Item, reasoning_keys: tuple[str, ...] = BOTH_FIELDS) -> dict[str, Any]:
    """The chat chunk delta of one reply part: reasoning (under each of `reasoning_keys`), content, or a tool
    call's piece."""
    if isinstance(part, Reasoning):
        return dict.fromkeys(reasoning_keys, part.text)
    return tool_delta(part)


def tool_delta(item: Item) -> dict[str, Any]:
    """The chat chunk delta of one parser item: content, a call's start (id and name) or arguments text."""
    if isinstance(item, str):
        return {"content": item}
    if isinstance(item, CallStart):
        return {"tool_calls": [{"index": item.index, "id": item.id, "type": "function",
                                "function": {"name": item.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": item.index, "function": {"arguments": item.text}}]}


def usage_body(usage: Usage, dropped_tool_calls: int = 0) -> dict[str, Any]:
    """OpenAI's usage object (with the prompt tokens the prefix cache served, and llmfleet's
    `dropped_tool_calls` when a call cut short by max_tokens was left out)."""
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if dropped_tool_calls:
        body["dropped_tool_calls"] = dropped_tool_calls
    return body


def timings_body(usage: Usage, timings: list[Timing]) -> dict[str, float | int]:
    """llama-server's `timings` object from the workers' timings (several jobs: the slowest one's durations).

    prompt_* counts the prompt tokens computed (not served by the prefix cache) from admission to the first
    token; predicted_* every completion token from the first to the last; queue_ms is the wait for a slot.
    """
    queue = max((t.queue_s for t in timings), default=0.0)
    prompt_s = max((t.first_token_s - t.queue_s for t in timings), default=0.0)
    predicted_s = max((t.total_s - t.first_token_s for t in timings), default=0.0)
    prompt_n = usage.prompt_tokens - usage.cached_tokens
    predicted_n = usage.completion_tokens
    return {
        "cache_n": usage.cached_tokens,
        "queue_ms": round(queue * 1e3, 3),
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_s * 1e3, 3),
        "prompt_per_token_ms": round(prompt_s * 1e3 / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(prompt_n / prompt_s, 3) if prompt_s > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_s * 1e3, 3),
        "predicted_per_token_ms": round(predicted_s * 1e3 / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(predicted_n / predicted_s, 3) if predicted_s > 0 else 0.0,
    }


def _token_bytes(entry: Any) -> list[int]:
    return list(entry.bytes) if entry.bytes is not None else list(entry.token.encode("utf-8"))


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": _token_bytes(e),
                "top_logprobs": [
                    {"token": t.token, "logprob": t.logprob, "bytes": _token_bytes(t)} for t in e.top
                ],
            }
            for e in entries
        ]
    }


class TextOffsets:
    """Where each token of one choice starts in its returned text (the prompt echo, then the completion), in
    characters: its bytes are decoded in order, so a character split over two tokens counts once, at its first."""

    def __init__(self) -> None:
        self._chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, entries: list[TokenLogprob]) -> list[int]:
        """The offsets of the choice's next tokens."""
        offsets = []
        for e in entries:
            offsets.append(self._chars)
            self._chars += len(self._decoder.decode(bytes(_token_bytes(e))))
        return offsets


def completion_logprobs(entries: list[TokenLogprob], offsets: TextOffsets) -> dict[str, Any]:
    """Legacy logprobs {tokens, token_logprobs, top_logprobs, text_offset}; `offsets` goes on from the choice's
    earlier tokens (a null logprob is the first prompt token of an echo, as OpenAI's)."""
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [
            None if e.logprob is None else {t.token: t.logprob for t in e.top} for e in entries
        ],
        "text_offset": offsets.take(entries),
    }


def chat_completion(
    response_id: str, created: int, model: str, choices: list[ChoiceResult], usage: Usage,
    reasoning_keys: tuple[str, ...] = BOTH_FIELDS,
) -> dict[str, Any]:
    """A chat.completion object (reasoning under each of `reasoning_keys`)."""
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": c.index,
                "message": _message(c, reasoning_keys),
                "logprobs": None if c.logprobs is None else chat_logprobs(c.logprobs),
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_body(usage, sum(c.dropped_calls for c in choices)),
    }


def text_completion(
    response_id: str, created: int, model: str, choices: list[ChoiceResult], usage: Usage
) -> dict[str, Any]:
    """A text_completion object."""
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "text": c.text,
                "index": c.index,
                "logprobs": None if c.logprobs is None else completion_logprobs(c.logprobs, TextOffsets()),
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_body(usage),
    }


@dataclass(frozen=True)
class ChunkHeader:
    """The fields every chunk of one stream repeats."""

    response_id: str
    created: int
    model: str
    include_usage: bool

    def chunk(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """A chunk around `choices`; with include_usage every chunk carries "usage": null."""
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, obj: str, usage: Usage, dropped_tool_calls: int = 0) -> dict[str, Any]:
        """The final chunk of an include_usage stream: no choices, the usage."""
        body = self.chunk(obj, [])
        body["usage"] = usage_body(usage, dropped_tool_calls)
        return body


def chat_chunk(
    header: ChunkHeader,
    index: int,
    delta: dict[str, Any],
    logprobs: list[TokenLogprob] | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A chat.completion.chunk with one choice."""
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": None if logprobs is None else chat_logprobs(logprobs),
        "finish_reason": finish_reason,
    }
    return header.chunk("chat.completion.chunk", [choice])


def completion_chunk(
    header: ChunkHeader,
    index: int,
    text: str,
    logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A text_completion chunk with one choice."""
    choice = {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}
    return header.chunk("text_completion", [choice])


def embedding_list(
    model: str, vectors: list[list[float]], usage: Usage, encoding_format: str
) -> dict[str, Any]:
    """An embeddings list; base64 is float32 little-endian, like OpenAI."""
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": vector if encoding_format == "float" else float32_base64(vector),
            }
            for i, vector in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens},
    }


def float32_base64(vector: list[float]) -> str:
    """Base64 of the vector as little-endian float32."""
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def model_object(model: str, created: int, *, loaded: bool = True) -> dict[str, Any]:
    """One entry of /v1/models (`loaded`: a worker serves it now; else a node agent loads it on demand)."""
    return {"id": model, "object": "model", "created": created, "owned_by": OWNED_BY, "loaded": loaded}


def model_list(models: list[dict[str, Any]]) -> dict[str, Any]:
    """The /v1/models list."""
    return {"object": "list", "data": models}


def adapter_objects(live: dict[str, list[RegistryEntry]]) -> list[dict[str, Any]]:
    """/v1/models entries of the loaded adapters: id `<base>:<adapter>`, with their parent (as vLLM lists them)."""
    objects = []
    for model, workers in sorted(live.items()):
        created = int(min(w.started for w in workers))
        for name in adapters_of(model, workers):
            objects.append({"id": f"{model}:{name}", "object": "model", "created": created, "owned_by": OWNED_BY,
                            "parent": model, "root": name})
    return objects
