"""Tool calls out of a reply's text: canonical `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
become OpenAI tool_calls with server-made ids.

The same incremental parser serves every path (chat collected and streamed, Anthropic's tool_use blocks, the
batch API), so streamed deltas reassemble to the collected reply: it releases content as it comes but holds
back whatever could still be the start of `<tool_call>` (a partial tag never leaks as content) and trailing
whitespace (dropped once calls follow). A call is held until its arguments value is complete and parses as
JSON, then released at once (its start with its name, then its whole arguments text): a call cut short (by
max_tokens, a stop string, a cancel) is never returned, so every call a client sees holds valid JSON, and a
stream never sends argument fragments of a call that is dropped later. Its complete predecessors are kept.

How a reply with calls ends (`tool_finish`): a choice that stopped after its calls is a tool turn (OpenAI's
finish_reason "tool_calls"); so is one cut by max_tokens when nothing but calls followed its first call and the
only thing cut was a further call (dropped, and counted in `dropped`) or the closing tag of the last one: every
call it returns is whole, so a client runs them as it would an uncut turn. Anything else cut stays "length".
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Protocol

from shared.tool_call_tags import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

DROPPED_HEADER = "x-llmfleet-dropped-tool-calls"  # a non-streamed reply's count of calls begun but not returned
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True)
class CallStart:
    """A new call: its position among the choice's calls, its id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """More of a call's arguments text."""

    index: int
    text: str


Item = str | CallStart | ArgumentsDelta  # a str is content


def new_call_id() -> str:
    """A server-made tool call id: 'call_' and 24 hex digits."""
    return f"call_{secrets.token_hex(12)}"


class ToolCallParser:
    """Splits one choice's text, fed in pieces, into content and tool calls."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "content"  # content | head (before the arguments value) | arguments | tail (before TOOL_CALL_CLOSE)
        self._depth, self._in_string, self._escaped = 0, False, False
        self._pending: dict[str, str] | None = None  # the call being generated, until its arguments are complete
        self.calls: list[dict[str, str]] = []  # {"id", "name", "arguments"} of every complete call released
        self.dropped = 0  # calls begun but never released (cut short, or arguments that are not JSON)
        self.text_after_calls = False  # content came after the first call (only without a grammar)

    def feed(self, text: str) -> list[Item]:
        """Take more text; return what it released."""
        self._buffer += text
        out: list[Item] = []
        while self._step(out):
            pass
        return self._noted(out)

    def finish(self) -> list[Item]:
        """The reply ended: release the content held; a call whose arguments are unfinished is dropped (so is
        whitespace or a partial tag after calls)."""
        held, self._buffer, self._pending = self._buffer, "", None
        if self._state == "content" and held and not (self.calls and TOOL_CALL_OPEN.startswith(held.strip())):
            return self._noted([held])
        if self._state == "content" and held.strip():
            self.dropped += 1  # the start of a further `<tool_call>` tag
        if self._state == "head" and held.strip() and not held.lstrip().startswith("{"):
            return self._noted([TOOL_CALL_OPEN + held])  # never became a call: it was text after all
        if self._state in ("head", "arguments"):
            self.dropped += 1  # a call cut short, before or inside its arguments
        return []

    def _noted(self, items: list[Item]) -> list[Item]:
        """Note content that follows a released call (the reply then did not end in calls alone)."""
        seen = len(self.calls) - sum(isinstance(item, CallStart) for item in items)  # released before these
        for item in items:
            if isinstance(item, CallStart):
                seen += 1
            elif isinstance(item, str) and item.strip() and seen:
                self.text_after_calls = True
        return items

    def _step(self, out: list[Item]) -> bool:
        """Advance one state as far as the buffer allows; True if the state changed."""
        if self._state == "content":
            at = self._buffer.find(TOOL_CALL_OPEN)
            if at < 0:
                keep = _partial_suffix(self._buffer, TOOL_CALL_OPEN)
                keep = max(keep, len(self._buffer) - len(self._buffer[: len(self._buffer) - keep].rstrip()))
                release = self._buffer[: len(self._buffer) - keep]
                if release and not (self.calls and not release.strip()):
                    out.append(release)
                self._buffer = self._buffer[len(release):]
                return False
            content = self._buffer[:at].rstrip()  # whitespace before a call is not content
            if content:
                out.append(content)
            self._buffer, self._state = self._buffer[at + len(TOOL_CALL_OPEN):], "head"
            return True
        if self._state == "head":
            match = _HEAD.match(self._buffer)
            if match is None:
                return False
            self._pending = {"id": new_call_id(), "name": json.loads(match.group(1)), "arguments": ""}
            self._buffer, self._state = self._buffer[match.end():], "arguments"
            self._depth, self._in_string, self._escaped = 0, False, False
            return True
        if self._state == "arguments":
            return self._step_arguments(out)
        at = self._buffer.find(TOOL_CALL_CLOSE)  # tail: the object's "}" and the closing tag
        if at < 0:
            return False
        self._buffer, self._state = self._buffer[at + len(TOOL_CALL_CLOSE):], "content"
        return True

    def _step_arguments(self, out: list[Item]) -> bool:
        """Take the pending call's arguments text; once the value closes, release the call if it is JSON."""
        call = self._pending
        assert call is not None
        if not call["arguments"]:
            self._buffer = self._buffer.lstrip()  # whitespace before the value, however it was split
        end = self._scan_arguments()
        call["arguments"] += self._buffer[:end]
        self._buffer = self._buffer[end:]
        if self._depth != 0 or not call["arguments"]:
            return False
        self._pending, self._state = None, "tail"
        if is_json(call["arguments"]):  # else (only without a grammar) it is no call: dropped
            self.calls.append(call)
            index = len(self.calls) - 1
            out.extend((CallStart(index, call["id"], call["name"]), ArgumentsDelta(index, call["arguments"])))
        else:
            self.dropped += 1
        return True

    def _scan_arguments(self) -> int:
        """How much of the buffer belongs to the arguments value (it ends where its brackets balance)."""
        for i, char in enumerate(self._buffer):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return len(self._buffer)


class CallSource(Protocol):
    """A parser's calls so far, and whether content followed the first (ToolCallParser, HarmonyParser)."""

    calls: list[dict[str, str]]
    text_after_calls: bool


def tool_finish(reason: str | None, parser: CallSource) -> str | None:
    """A choice's finish_reason once its calls are parsed: "tool_calls" for a tool turn (see the module's
    docstring), else the worker's reason."""
    if not parser.calls:
        return reason
    if reason == "stop" or (reason == "length" and not parser.text_after_calls):
        return "tool_calls"
    return reason


def dropped_headers(count: int) -> dict[str, str]:
    """The response header that shows calls were dropped (none when none were)."""
    return {DROPPED_HEADER: str(count)} if count else {}


def is_json(text: str) -> bool:
    """Whether text parses as JSON."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


@dataclass(frozen=True)
class SplitReply:
    """A whole reply, its calls parsed out."""

    content: str | None  # None when it is only calls
    calls: list[dict[str, str]]
    finish_reason: str | None  # as tool_finish gives it
    dropped: int  # calls begun but not returned


def split_reply(text: str) -> tuple[str | None, list[dict[str, str]]]:
    """A whole reply's content (None when it is only calls) and its calls."""
    split = split_ended_reply(text, None)
    return split.content, split.calls


def split_ended_reply(text: str, reason: str | None) -> SplitReply:
    """A whole reply that ended for `reason`: its content, calls, finish_reason and dropped calls."""
    parser = ToolCallParser()
    items = parser.feed(text) + parser.finish()
    content = "".join(item for item in items if isinstance(item, str))
    return SplitReply((content or None) if parser.calls else content, parser.calls, tool_finish(reason, parser),
                      parser.dropped)
