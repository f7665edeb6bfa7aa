"""Stopping: stop strings matched across token boundaries, and end-of-generation / length checks.

With `after_thinking`, a reply that opens with a thinking block (`<think>…</think>`, leading whitespace allowed)
has stop strings matched in its answer only: the block passes through unmatched (its reasoning is split off
the answer downstream, so a stop string applies to what the client gets as the answer). With `harmony` (gpt-oss),
the answer is the final channel's text: everything up to `<|channel|>final` and the `<|message|>` after it passes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HARMONY_ANSWER = ("<|channel|>final", "<|message|>")  # what a harmony reply writes before its answer, in order


class StopReason:
    """The finish_reason values of the engine (the wire's FinishReason has the same values)."""

    STOP: Final = "stop"  # an end-of-generation token or a stop string
    LENGTH: Final = "length"  # max_tokens (or the context window) reached
    CANCELLED: Final = "cancelled"  # ended from outside (client gone, deadline)


class StopStringMatcher:
    """Filters streamed text: withholds what could start a stop string, cuts at the first full match."""

    def __init__(self, stop: Sequence[str], *, after_thinking: bool = False, opened: bool = False,
                 harmony: bool = False) -> None:
        self.stop_strings: tuple[str, ...] = tuple(dict.fromkeys(s for s in stop if s))  # empty ones ignored
        self._held = ""  # a suffix of the text so far that is a proper prefix of some stop string
        self.matched: str | None = None  # the stop string that ended the text, once stopped
        # start | thinking | answer; `opened`: the prompt opened the block (the reply starts inside it)
        self._phase = ("thinking" if opened or harmony else "start") \
            if (after_thinking or harmony) and self.stop_strings else "answer"
        self._closers = list(HARMONY_ANSWER if harmony else (THINK_CLOSE,))  # thinking: what ends it, in order
        self._scan = ""  # start: the undecided text (held); thinking: the last few characters released

    @property
    def stopped(self) -> bool:
        """Whether a stop string has been found (all later text is dropped)."""
        return self.matched is not None

    def push(self, text: str) -> tuple[str, bool]:
        """Add newly decoded text; return (text safe to emit now, stopped)."""
        if self.stopped:
            return "", True
        if not self.stop_strings:
            return text, False
        if self._phase != "answer":
            passed, text = self._through_thinking(text)
            if self._phase != "answer" or not text:
                return passed, False
            out, stopped = self._match(text)
            return passed + out, stopped
        return self._match(text)

    def _match(self, text: str) -> tuple[str, bool]:
        buffer = self._held + text
        cut, matched = self._first_match(buffer)
        if matched is not None:
            self._held = ""
            self.matched = matched
            return buffer[:cut], True
        keep = self._longest_partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """Release the withheld text at the end of generation (nothing once stopped)."""
        if self._phase == "start":  # it never became a thinking block: answer text after all
            self._phase, undecided, self._scan = "answer", self._scan, ""
            out, stopped = self._match(undecided)
            return out if stopped else out + self.flush()
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _through_thinking(self, text: str) -> tuple[str, str]:
        """(text released unmatched, the rest, which is answer text to match) while a thinking block may open
        or runs."""
        if self._phase == "start":
            self._scan += text
            head = self._scan.lstrip()
            if head.startswith(THINK_OPEN):
                opened = len(self._scan) - len(head) + len(THINK_OPEN)
                released, pending = self._scan[:opened], self._scan[opened:]
                self._phase, self._scan = "thinking", ""
                more, rest = self._thinking(pending)
                return released + more, rest
            if THINK_OPEN.startswith(head):
                return "", ""  # whitespace or a partial tag so far: held until it is decided
            self._phase, rest, self._scan = "answer", self._scan, ""
            return "", rest
        return self._thinking(text)

    def _thinking(self, text: str) -> tuple[str, str]:
        scan = self._scan + text  # the characters before len(self._scan) were released already
        released, end = len(self._scan), 0
        while self._closers:
            at = scan.find(self._closers[0], end)
            if at < 0:
                self._scan = scan[len(scan) - min(len(scan) - end, len(self._closers[0]) - 1):]
                return text, ""
            end = at + len(self._closers.pop(0))
        self._phase, self._scan = "answer", ""
        return scan[released:end], scan[end:]

    def _first_match(self, buffer: str) -> tuple[int, str | None]:
        """The earliest stop string occurrence in buffer (the longest one when two start together)."""
        best_at, best = len(buffer) + 1, None
        for stop in self.stop_strings:
            at = buffer.find(stop)
            if at != -1 and (at < best_at or (at == best_at and best is not None and len(stop) > len(best))):
                best_at, best = at, stop
        return best_at, best

    def _longest_partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest


def check_token_stop(
    token_id: int,
    *,
    eog_ids: Collection[int],
    ignore_eos: bool,
    generated_count: int,
    max_tokens: int | None,
) -> str | None:
    """'stop' for an end-of-generation token, 'length' once max_tokens are generated, else None."""
    # generated_count counts every token generated so far, this one included; an end-of-generation
    # token wins over the length limit when both apply.
    if not ignore_eos and token_id in eog_ids:
        return StopReason.STOP
    if max_tokens is not None and generated_count >= max_tokens:
        return StopReason.LENGTH
    return None
