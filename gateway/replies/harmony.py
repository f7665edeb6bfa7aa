"""A harmony reply (gpt-oss) split as llama-server's gpt-oss parser splits it (common/parsers/gpt-oss.cpp).

The reply continues a prompt that ends with `<|start|>assistant`; it is a run of messages, each a header up to
`<|message|>` (`<|channel|>NAME`, a recipient `to=...` before or after the channel, a content type such as
` <|constrain|>json`) and a body up to `<|end|>` (then `<|start|>assistant` and the next header) or to the reply's end
(`<|return|>` and `<|call|>` end generation and are never in the text):
- `analysis` is reasoning (llama.cpp joins several blocks as they come); with reasoning off the whole message,
  `<|channel|>analysis<|message|>...<|end|>`, stays in the content, as llama-server's `reasoning_format: none` keeps it;
- `final`, and `commentary` without a recipient (a preamble), are content;
- a message to `functions.NAME` (on commentary or analysis) is a tool call whose body is its JSON arguments, released
  whole once the message ends and only if it is a JSON object (a call cut short is dropped, as the canonical parser
  drops it); without tools in the request, and for any other recipient (built-in tools), it is dropped.
A reply that does not open with a header is content as it stands. Streamed pieces never carry a marker, whole or
partial: a header is held until its `<|message|>`, and a body's tail while it could be the start of a marker.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gateway.replies.reasoning import Reasoning
from gateway.replies.tool_calls import ArgumentsDelta, CallStart, Item, new_call_id

Part = Reasoning | Item
START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
ENDS = (END, "<|call|>", "<|return|>")  # a body ends here
BREAKS = (START, CHANNEL)  # or here, where a new header begins without an `<|end|>` first
OPENERS = (START, CHANNEL, " to=", "to=")  # what a reply's first header may start with
MAX_HEADER = 512  # characters: a header this long without `<|message|>` is not one
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>([A-Za-z0-9_-]*)")


@dataclass(frozen=True)
class Header:
    """What one message's header says."""

    channel: str  # analysis | commentary | final | "" (none given)
    recipient: str | None  # "functions.get_weather", "browser.search"; None: the user (also `to=assistant`)
    raw: str  # the header as written, from its `<|channel|>` on (what content keeps with reasoning off)


def parse_header(text: str) -> Header:
    """The channel and recipient of a header (the text before `<|message|>`; the last channel named wins)."""
    channels = _CHANNEL.findall(text)
    recipient = _RECIPIENT.search(text)
    name = recipient.group(1) if recipient else None
    at = text.rfind(CHANNEL)
    return Header(channels[-1] if channels else "", None if name in (None, "assistant") else name,
                  text[at:] if at >= 0 else text)


class HarmonyParser:
    """Splits one choice's harmony text, fed in pieces, into reasoning, content and tool calls."""

    def __init__(self, *, reasoning: bool, tools: bool) -> None:
        self._reasoning, self._tools = reasoning, tools
        self._buffer = ""
        self._state = "start"  # start | header | body | plain
        self._header: Header | None = None
        self._body = ""  # a call's arguments so far
        self.reasoning: str | None = None  # every reasoning text released (None: no analysis message)
        self.calls: list[dict[str, str]] = []  # {"id", "name", "arguments"} of every call released
        self.dropped = 0  # calls begun but not released (cut short, or not a JSON object)
        self.text_after_calls = False  # content came after the first call

    def feed(self, text: str) -> list[Part]:
        """Take more text; return what it released."""
        self._buffer += text
        out: list[Part] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Part]:
        """The reply ended: release what is held (a call whose arguments are a JSON object is whole)."""
        out: list[Part] = []
        held, self._buffer = self._buffer, ""
        if self._state in ("start", "plain"):
            self._content(out, held)  # never a harmony reply: text as it stands
        elif self._state == "body":
            self._body_text(out, held)
            self._end_message(out)
        return out  # a header cut short is dropped

    def _step(self, out: list[Part]) -> bool:
        """Advance one state as far as the buffer allows; True if the state changed."""
        buffer = self._buffer
        if self._state == "start":
            head = buffer.lstrip()
            if any(head.startswith(o) for o in OPENERS):
                self._state = "header"
                return True
            if any(o.startswith(head) for o in OPENERS):
                return False  # empty, whitespace or a partial opener so far
            self._state = "plain"
            return True
        if self._state == "plain":
            self._content(out, buffer)
            self._buffer = ""
            return False
        if self._state == "header":
            at = buffer.find(MESSAGE)
            if at < 0:
                if len(buffer) > MAX_HEADER:
                    self._state = "plain"  # not a header after all: text
                    return True
                return False
            self._header, self._buffer, self._body = parse_header(buffer[:at]), buffer[at + len(MESSAGE):], ""
            self._state = "body"
            if self._kind() == "analysis" and self._reasoning:
                self.reasoning = self.reasoning or ""
            elif self._kind() == "analysis":
                self._content(out, self._header.raw + MESSAGE)
            return True
        return self._step_body(out)

    def _step_body(self, out: list[Part]) -> bool:
        """Release body text up to a marker; at one, end the message."""
        buffer = self._buffer
        stops = [(buffer.find(m), m) for m in (*ENDS, *BREAKS) if m in buffer]
        if not stops:
            keep = max(_partial_suffix(buffer, m) for m in (*ENDS, *BREAKS))
            self._body_text(out, buffer[: len(buffer) - keep])
            self._buffer = buffer[len(buffer) - keep:]
            return False
        at, marker = min(stops)
        self._body_text(out, buffer[:at])
        self._buffer = buffer[at + len(marker):] if marker in ENDS else buffer[at:]
        if marker == END and self._kind() == "analysis" and not self._reasoning:
            self._content(out, END)
        self._end_message(out)
        self._state, self._header = "header", None
        return True

    def _kind(self) -> str:
        """What the current message is: analysis, content, call or dropped."""
        header = self._header
        assert header is not None
        if header.recipient is not None:
            return "call" if self._tools and header.recipient.startswith("functions.") else "dropped"
        return "analysis" if header.channel == "analysis" else "content"

    def _body_text(self, out: list[Part], text: str) -> None:
        """Route body text by the message's kind."""
        if not text:
            return
        kind = self._kind()
        if kind == "analysis" and self._reasoning:
            self.reasoning = (self.reasoning or "") + text
            out.append(Reasoning(text))
        elif kind in ("analysis", "content"):
            self._content(out, text)
        elif kind == "call":
            self._body += text

    def _end_message(self, out: list[Part]) -> None:
        """A message ended (at a marker, or with the reply): release its call if it is one."""
        if self._header is None or self._kind() != "call":
            return
        arguments = self._body.strip()
        if _is_object(arguments):
            assert self._header.recipient is not None
            call = {"id": new_call_id(), "name": self._header.recipient.removeprefix("functions."),
                    "arguments": arguments}
            self.calls.append(call)
            index = len(self.calls) - 1
            out.extend((CallStart(index, call["id"], call["name"]), ArgumentsDelta(index, arguments)))
        else:
            self.dropped += 1
        self._body = ""

    def _content(self, out: list[Part], text: str) -> None:
        if text:
            self.text_after_calls = self.text_after_calls or (bool(self.calls) and bool(text.strip()))
            out.append(text)


def _is_object(text: str) -> bool:
    """Whether text is a JSON object."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
