"""Stopping tests: stop strings across pushes, withheld partial matches, flush, token stop checks."""

from __future__ import annotations

import pytest

from worker.engine.text.stopping import StopReason, StopStringMatcher, check_token_stop


def run(stop: list[str], pushes: list[str]) -> tuple[list[str], bool, str]:
    """Push every piece (until stopped); return the emitted pieces, stopped, and the flush."""
    matcher = StopStringMatcher(stop)
    emitted: list[str] = []
    stopped = False
    for piece in pushes:
        text, stopped = matcher.push(piece)
        emitted.append(text)
        if stopped:
            break
    return emitted, stopped, matcher.flush()


def test_stop_string_split_across_three_pushes_is_never_emitted() -> None:
    """'###' arriving as '#', '#', '#' is withheld, then dropped with everything after it."""
    emitted, stopped, flushed = run(["###"], ["Hello #", "#", "# tail", "more"])
    assert emitted == ["Hello ", "", ""]
    assert stopped and flushed == ""
    assert "#" not in "".join(emitted)


def test_partial_match_that_fails_is_released() -> None:
    """A prefix of the stop string is held only until the next text rules it out."""
    matcher = StopStringMatcher(["</end>"])
    assert matcher.push("a </e") == ("a ", False)
    assert matcher.push("x>") == ("</ex>", False)
    assert matcher.push(" ok") == (" ok", False)
    assert not matcher.stopped and matcher.flush() == ""


def test_held_text_is_released_by_flush() -> None:
    """Text still withheld at the end of generation comes out of flush()."""
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("the end ST") == ("the end ", False)
    assert matcher.flush() == "ST"
    assert matcher.flush() == ""


def test_multiple_stop_strings_earliest_wins() -> None:
    """With several stop strings the earliest occurrence cuts the text and is reported."""
    matcher = StopStringMatcher(["world", "lo w", "\n\n"])
    assert matcher.push("hel") == ("he", False)  # 'l' could start 'lo w'
    assert matcher.push("lo world\n\n") == ("l", True)
    assert matcher.matched == "lo w"


def test_same_start_prefers_longer_stop() -> None:
    """Two stop strings found at the same place: the longer one is the match."""
    matcher = StopStringMatcher(["ab", "abc"])
    assert matcher.push("xabc") == ("x", True)
    assert matcher.matched == "abc"


def test_overlapping_prefixes_hold_the_longest_candidate() -> None:
    """'aab' inside 'aaab' is found although the first 'a' starts a failed candidate."""
    emitted, stopped, _ = run(["aab"], ["a", "a", "a", "b"])
    assert "".join(emitted) == "a" and stopped


def test_stop_at_the_very_start_and_after_stopping() -> None:
    """A match at position 0 emits nothing; later pushes emit nothing and say stopped."""
    matcher = StopStringMatcher(["<|"])
    assert matcher.push("<|im_end|>") == ("", True)
    assert matcher.push("more") == ("", True)
    assert matcher.stopped and matcher.flush() == ""


@pytest.mark.parametrize("stop", [[], [""]])
def test_no_stop_strings_passes_everything(stop: list[str]) -> None:
    """Without (non-empty) stop strings nothing is held back."""
    matcher = StopStringMatcher(stop)
    assert matcher.push("abc") == ("abc", False)
    assert matcher.flush() == ""


def test_concatenation_equals_text_before_stop() -> None:
    """Whatever the split, the emitted text is exactly the text before the first stop string."""
    text = "one two <stop> three"
    for size in range(1, 6):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        emitted, stopped, flushed = run(["<stop>", "four"], pieces)
        assert "".join(emitted) + flushed == "one two " and stopped


def test_check_token_stop() -> None:
    """eog tokens stop unless ignore_eos; max_tokens gives 'length'; eog wins over length."""
    eog = frozenset({2})
    assert check_token_stop(2, eog_ids=eog, ignore_eos=False, generated_count=1, max_tokens=10) == "stop"
    assert check_token_stop(2, eog_ids=eog, ignore_eos=True, generated_count=1, max_tokens=10) is None
    assert check_token_stop(5, eog_ids=eog, ignore_eos=False, generated_count=10, max_tokens=10) == "length"
    assert (
        check_token_stop(2, eog_ids=eog, ignore_eos=False, generated_count=10, max_tokens=10)
        == StopReason.STOP
    )
    assert check_token_stop(5, eog_ids=eog, ignore_eos=False, generated_count=9, max_tokens=10) is None
    assert check_token_stop(5, eog_ids=eog, ignore_eos=False, generated_count=10**6, max_tokens=None) is None
    assert StopReason.LENGTH == "length"


def _after_thinking(stop: list[str], text: str, size: int) -> tuple[str, str | None]:
    """Push text in pieces of `size` to a matcher that skips a leading thinking block; (emitted, matched)."""
    matcher = StopStringMatcher(stop, after_thinking=True)
    out = ""
    for i in range(0, len(text), size):
        piece, stopped = matcher.push(text[i:i + size])
        out += piece
        if stopped:
            return out, matcher.matched
    return out + matcher.flush(), matcher.matched


@pytest.mark.parametrize("size", [1, 2, 3, 5, 1000])
def test_stop_strings_skip_a_leading_thinking_block(size: int) -> None:
    text = "<think>\nStop? No: STOP is only a word here.\n</think>\n\nThe answer. STOP and more"
    assert _after_thinking(["STOP"], text, size) == (text[:text.rindex("STOP")], "STOP")
    assert _after_thinking(["</think>"], text, size) == (text, None)  # the block's own tag is no stop either


@pytest.mark.parametrize("size", [1, 2, 4, 1000])
def test_without_a_leading_block_stop_strings_apply_from_the_start(size: int) -> None:
    assert _after_thinking(["<th"], " <th and more", size) == (" ", "<th")
    assert _after_thinking(["STOP"], "Plain STOP <think>", size) == ("Plain ", "STOP")
    assert _after_thinking(["x"], "  <thi", size) == ("  <thi", None)  # a partial tag at the end is text
    assert _after_thinking(["STOP"], "<think>never closed STOP", size) == ("<think>never closed STOP", None)


def test_a_prompt_that_opened_the_block_starts_the_reply_inside_it() -> None:
    matcher = StopStringMatcher(["STOP"], after_thinking=True, opened=True)
    assert matcher.push("thinking STOP here\n</thi") == ("thinking STOP here\n</thi", False)
    assert matcher.push("nk>\nAnswer STOP more") == ("nk>\nAnswer ", True) and matcher.matched == "STOP"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 1000])
def test_harmony_stop_strings_apply_to_the_final_channel_only(size: int) -> None:
    head = ("<|channel|>analysis<|message|>STOP is a word here<|end|><|start|>assistant"
            "<|channel|>final <|constrain|>json<|message|>")
    text = head + "The answer STOP more"
    matcher = StopStringMatcher(["STOP", "<|message|>"], harmony=True)
    out = [matcher.push(text[i:i + size]) for i in range(0, len(text), size)]
    assert "".join(piece for piece, _ in out) == head + "The answer " and matcher.matched == "STOP"
    cut = StopStringMatcher(["STOP"], harmony=True)  # a reply that never reaches its final channel
    assert cut.push("<|channel|>analysis<|message|>STOP") == ("<|channel|>analysis<|message|>STOP", False)
    assert cut.flush() == ""
