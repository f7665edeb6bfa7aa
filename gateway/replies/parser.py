"""One choice's reply, parsed as it streams, by its model's reply format: the default one has its thinking block
split off (gateway/replies/reasoning.py), then tool calls parsed out of the answer alone (gateway/replies/tool_calls.py);
a harmony reply (gpt-oss) goes through gateway/replies/harmony.py. Every streaming surface feeds its text here, and
every collected reply is split by `whole_reply`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.replies.harmony import HarmonyParser
from gateway.replies.reasoning import Reasoning, ReasoningSplitter, split_reasoning
from gateway.replies.tool_calls import Item, ToolCallParser, split_ended_reply, tool_finish

Part = Reasoning | Item  # reasoning text, answer text (str), or a tool call's start / arguments
# How a model's replies are written (its workers say so in the registry): "default" (may open with a `<think>`
# block; calls in `<tool_call>` blocks), "opened" (the same, starting inside the block: the prompt opened it) or
# "harmony" (OpenAI's channels, gpt-oss).
ReplyFormat = Literal["default", "opened", "harmony"]
REPLY_FORMATS: tuple[str, ...] = ("default", "opened", "harmony")


def needs_parsing(reply_format: str, *, chat: bool, reasoning: bool, tools: bool) -> bool:
    """Whether a reply goes through a parser at all (a harmony chat reply always does: its markers are no text)."""
    return reasoning or tools or (chat and reply_format == "harmony")


class ReplyParser:
    """Reasoning first (when `reasoning`), then the answer's content and tool calls (when `tools`)."""

    def __init__(self, *, reasoning: bool, tools: bool, reply_format: str = "default") -> None:
        harmony = reply_format == "harmony"
        self._harmony = HarmonyParser(reasoning=reasoning, tools=tools) if harmony else None
        self._splitter = ReasoningSplitter(forced_open=reply_format == "opened") if reasoning and not harmony else None
        self._tools = ToolCallParser() if tools and not harmony else None

    @property
    def calls(self) -> list[dict[str, str]]:
        """The complete tool calls released so far."""
        source = self._harmony or self._tools
        return source.calls if source is not None else []

    @property
    def dropped(self) -> int:
        """Calls begun but not released (cut short by the token limit, or not JSON)."""
        source = self._harmony or self._tools
        return source.dropped if source is not None else 0

    def finish_reason(self, reason: str | None) -> str | None:
        """The choice's finish_reason once the reply ended (finish() called): "tool_calls" for a tool turn."""
        source = self._harmony or self._tools
        return tool_finish(reason, source) if source is not None else reason

    def feed(self, text: str) -> list[Part]:
        """Take more text; return what it released."""
        if self._harmony is not None:
            return self._harmony.feed(text)
        return self._answer(self._splitter.feed(text) if self._splitter is not None else [text])

    def finish(self) -> list[Part]:
        """The reply ended: release what is held."""
        if self._harmony is not None:
            return self._harmony.finish()
        parts = self._answer(self._splitter.finish() if self._splitter is not None else [])
        return parts + (self._tools.finish() if self._tools is not None else [])

    def _answer(self, pieces: list[Reasoning | str]) -> list[Part]:
        out: list[Part] = []
        for piece in pieces:
            if isinstance(piece, Reasoning) or self._tools is None:
                out.append(piece)
            elif piece:
                out.extend(self._tools.feed(piece))
        return [part for part in out if not (isinstance(part, str) and not part)]


@dataclass(frozen=True)
class WholeReply:
    """A whole reply, split."""

    reasoning: str | None  # None: the reply had no thinking (or reasoning was not asked for)
    content: str | None  # None when the reply is only calls
    calls: list[dict[str, str]]
    finish_reason: str | None  # as tool_finish gives it
    dropped: int  # calls begun but not returned


def whole_reply(text: str, reason: str | None, *, reasoning: bool, tools: bool,
                reply_format: str = "default") -> WholeReply:
    """A whole reply that ended for `reason`, split as its streamed pieces would be."""
    if reply_format == "harmony":
        parser = HarmonyParser(reasoning=reasoning, tools=tools)
        parts = parser.feed(text) + parser.finish()
        content = "".join(part for part in parts if isinstance(part, str))
        return WholeReply(parser.reasoning, (content or None) if parser.calls else content, parser.calls,
                          tool_finish(reason, parser), parser.dropped)
    thought = None
    if reasoning:
        thought, text = split_reasoning(text, forced_open=reply_format == "opened")
    if not tools:
        return WholeReply(thought, text, [], reason, 0)
    split = split_ended_reply(text, reason)
    return WholeReply(thought, split.content, split.calls, split.finish_reason, split.dropped)
