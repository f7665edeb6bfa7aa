"""Stopping: stop strings matched across token boundaries, and end-of-generation / length checks."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final


class StopReason:
    """The finish_reason values of the engine (the wire's FinishReason has the same values)."""

    STOP: Final = "stop"  # an end-of-generation token or a stop string
    LENGTH: Final = "length"  # max_tokens (or the context window) reached
    CANCELLED: Final = "cancelled"  # ended from outside (client gone, deadline)


class StopStringMatcher:
    """Filters streamed text: withholds what could start a stop string, cuts at the first full match."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop_strings: tuple[str, ...] = tuple(dict.fromkeys(s for s in stop if s))  # empty ones ignored
        self._held = ""  # a suffix of the text so far that is a proper prefix of some stop string
        self.matched: str | None = None  # the stop string that ended the text, once stopped

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
        held, self._held = self._held, ""
        return "" if self.stopped else held

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
