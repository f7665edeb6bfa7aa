"""One choice's reply, parsed as it streams: its thinking block split off (gateway/replies/reasoning.py), then tool
calls parsed out of the answer alone (gateway/replies/tool_calls.py). Every streaming surface feeds its text here."""

from __future__ import annotations

from gateway.replies.reasoning import Reasoning, ReasoningSplitter
from gateway.replies.tool_calls import Item, ToolCallParser, tool_finish

Part = Reasoning | Item  # reasoning text, answer text (str), or a tool call's start / arguments


class ReplyParser:
    """Reasoning first (when `reasoning`), then the answer's content and tool calls (when `tools`)."""

    def __init__(self, *, reasoning: bool, tools: bool, forced_open: bool = False) -> None:
        self._splitter = ReasoningSplitter(forced_open=forced_open) if reasoning else None
        self._tools = ToolCallParser() if tools else None

    @property
    def calls(self) -> list[dict[str, str]]:
        """The complete tool calls released so far."""
        return self._tools.calls if self._tools is not None else []

    @property
    def dropped(self) -> int:
        """Calls begun but not released (cut short by the token limit, or not JSON)."""
        return self._tools.dropped if self._tools is not None else 0

    def finish_reason(self, reason: str | None) -> str | None:
        """The choice's finish_reason once the reply ended (finish() called): "tool_calls" for a tool turn."""
        return tool_finish(reason, self._tools) if self._tools is not None else reason

    def feed(self, text: str) -> list[Part]:
        """Take more text; return what it released."""
        return self._answer(self._splitter.feed(text) if self._splitter is not None else [text])

    def finish(self) -> list[Part]:
        """The reply ended: release what is held."""
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
