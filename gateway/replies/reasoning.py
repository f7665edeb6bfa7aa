"""Reasoning output: a reply that opens with a thinking block (`<think>…</think>`, the DeepSeek-R1 / Qwen3
convention) is split into its reasoning and its answer, as llama-server's `--reasoning-format deepseek` does.

One streaming splitter serves every API surface (chat's `reasoning_content` and `reasoning`, the same text under
DeepSeek's and vLLM's names, either one turned off by LLMFLEET_REASONING_FIELDS; Anthropic's `thinking` block, and
any other adapter): feed it the reply's text in pieces of any size and it releases `Reasoning` pieces and
answer text (plain `str`), never a whole or partial tag. Only a block that opens the reply counts (leading
whitespace allowed): a `<think>` later in the answer is answer text. A reply whose prompt already opened the
block (`forced_open`, a template whose generation prompt ends with `<think>`) starts inside it. A block never
closed (cut short by max_tokens) is all reasoning. Whitespace around the reasoning and at the start of the
answer is dropped, as llama-server trims them. The answer alone goes on to the tool-call parser.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.http.fields import integer, invalid

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("none", "deepseek", "auto")  # llama-server's reasoning_format values ("auto" = "deepseek" here)
# what the worker gives every chat template itself (worker/engine/text/chat_template.py RESERVED_TEMPLATE_VARIABLES)
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")
MAX_TEMPLATE_KWARGS_BYTES = 4096  # chat_template_kwargs as JSON
MAX_THINKING_BUDGET = 1 << 20
# OpenAI's reasoning_effort values; as llama-server, "none" turns thinking off (enable_thinking false) and any other
# becomes the chat template's `reasoning_effort` variable (gpt-oss's template writes it: "Reasoning: high")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


BOTH_FIELDS = ("reasoning_content", "reasoning")


def reasoning_keys(fields: str) -> tuple[str, ...]:
    """The chat message / delta fields that carry reasoning output, for LLMFLEET_REASONING_FIELDS (both, reasoning
    or reasoning_content)."""
    return BOTH_FIELDS if fields == "both" else (fields,)


@dataclass(frozen=True)
class Reasoning:
    """A piece of the thinking block's text."""

    text: str


Piece = str | Reasoning  # a str is answer text


def parse_reasoning_format(body: dict[str, Any], default: str) -> bool:
    """Whether a request's reply is split (`reasoning_format`, default the server's LLMFLEET_REASONING_FORMAT)."""
    value = body.get("reasoning_format", default)
    if value not in FORMATS:
        raise invalid("reasoning_format", f"expected one of {', '.join(repr(f) for f in FORMATS)}.")
    return value != "none"


@dataclass(frozen=True)
class ThinkingSwitch:
    """A request's say over a reasoning model's thinking: extra chat-template variables (`enable_thinking`, as
    vLLM and llama-server take chat_template_kwargs) and a thinking budget in tokens (None: unbounded)."""

    template_kwargs: dict[str, Any]
    budget: int | None = None

    @property
    def disabled(self) -> bool:
        """Whether the request turned thinking off (`enable_thinking: false`)."""
        return self.template_kwargs.get("enable_thinking") is False


def parse_thinking_switch(body: dict[str, Any], max_tokens: int | None) -> ThinkingSwitch:
    """`chat_template_kwargs` (a JSON object of extra template variables; `enable_thinking` a boolean),
    `reasoning_effort` (OpenAI's; over chat_template_kwargs, as llama-server reads it: see REASONING_EFFORTS) and
    `thinking_budget_tokens` (llmfleet's: `</think>` is forced after that many tokens; below max_tokens)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs", "expected an object of template variables.")
    taken = [name for name in kwargs if name in RESERVED_TEMPLATE_VARIABLES]
    if taken:
        raise invalid("chat_template_kwargs", f"{taken[0]!r} is set by the server and cannot be replaced.")
    if len(json.dumps(kwargs)) > MAX_TEMPLATE_KWARGS_BYTES:
        raise invalid("chat_template_kwargs", f"at most {MAX_TEMPLATE_KWARGS_BYTES} bytes as JSON.")
    if not isinstance(kwargs.get("enable_thinking", True), bool):
        raise invalid("chat_template_kwargs.enable_thinking", "expected a boolean.")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise invalid("reasoning_effort", f"expected one of {', '.join(repr(e) for e in REASONING_EFFORTS)}.")
    if effort == "none":
        kwargs = {**{k: v for k, v in kwargs.items() if k != "reasoning_effort"}, "enable_thinking": False}
    elif effort is not None:
        kwargs = {**kwargs, "reasoning_effort": effort}
    budget = integer(body, "thinking_budget_tokens", None, 1, MAX_THINKING_BUDGET)
    if budget is not None and max_tokens is not None and budget >= max_tokens:
        raise invalid("thinking_budget_tokens", f"must be below max_tokens ({max_tokens}).")
    if budget is not None and kwargs.get("enable_thinking") is False:
        raise invalid("thinking_budget_tokens", "a thinking budget needs thinking enabled.")
    return ThinkingSwitch(dict(kwargs), budget)


class ReasoningSplitter:
    """Splits one choice's text, fed in pieces, into reasoning and answer."""

    def __init__(self, *, forced_open: bool = False) -> None:
        self._buffer = ""
        self._state = "reasoning-start" if forced_open else "start"  # start | reasoning-start | reasoning |
        self.reasoning = ""  # every reasoning text released       # answer-start | answer

    def feed(self, text: str) -> list[Piece]:
        """Take more text; return what it released."""
        self._buffer += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Piece]:
        """The reply ended: release what is held (a block never closed is all reasoning)."""
        held, self._buffer = self._buffer, ""
        if self._state == "start" and held:
            return [held]  # a partial `<think>` (or only whitespace): it was answer text
        if self._state == "reasoning" and held.rstrip():
            return self._reason(held.rstrip())
        return []

    def _reason(self, text: str) -> list[Piece]:
        self.reasoning += text
        return [Reasoning(text)]

    def _step(self, out: list[Piece]) -> bool:
        """Advance one state as far as the buffer allows; True if the state changed."""
        state, buffer = self._state, self._buffer
        if state == "start":
            head = buffer.lstrip()
            if head.startswith(OPEN):
                self._buffer, self._state = head[len(OPEN):], "reasoning-start"
                return True
            if OPEN.startswith(head):
                return False  # empty, whitespace or a partial tag so far
            self._state = "answer"
            return True
        if state in ("reasoning-start", "answer-start"):
            self._buffer = buffer.lstrip()
            if not self._buffer:
                return False
            self._state = "reasoning" if state == "reasoning-start" else "answer"
            return True
        if state == "reasoning":
            at = buffer.find(CLOSE)
            if at >= 0:
                if buffer[:at].rstrip():
                    out.extend(self._reason(buffer[:at].rstrip()))
                self._buffer, self._state = buffer[at + len(CLOSE):], "answer-start"
                return True
            keep = _partial_suffix(buffer, CLOSE)
            keep = max(keep, len(buffer) - len(buffer[: len(buffer) - keep].rstrip()))  # and trailing whitespace
            if len(buffer) > keep:
                out.extend(self._reason(buffer[: len(buffer) - keep]))
                self._buffer = buffer[len(buffer) - keep:]
            return False
        if buffer:  # answer
            out.append(buffer)
            self._buffer = ""
        return False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def split_reasoning(text: str, *, forced_open: bool = False) -> tuple[str | None, str]:
    """A whole reply's reasoning (None when it has no thinking block) and its answer."""
    splitter = ReasoningSplitter(forced_open=forced_open)
    pieces = splitter.feed(text) + splitter.finish()
    answer = "".join(piece for piece in pieces if isinstance(piece, str))
    opened = forced_open or text.lstrip().startswith(OPEN)
    return (splitter.reasoning if opened else None), answer
