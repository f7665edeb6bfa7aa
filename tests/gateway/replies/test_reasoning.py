"""The reasoning splitter: however a reply is cut into pieces, the streamed pieces reassemble to the whole
reply's split, and no part of a <think> tag ever reaches the answer."""

from __future__ import annotations

import pytest

from gateway.replies.reasoning import Reasoning, ReasoningSplitter, parse_reasoning_format, split_reasoning
from shared.errors import InvalidRequest

CASES = [  # (reply, forced_open, reasoning, answer)
    ("<think>\nThe user greets me.\n</think>\n\nHello!", False, "The user greets me.", "Hello!"),
    ("  <think>a < b, and </thin is not the end</think>Yes", False, "a < b, and </thin is not the end", "Yes"),
    ("Plain answer <think>not reasoning</think>", False, None, "Plain answer <think>not reasoning</think>"),
    ("<think>cut short by max_tok", False, "cut short by max_tok", ""),
    ("<thi", False, None, "<thi"),
    ("", False, None, ""),
    ("<think></think>Answer", False, "", "Answer"),
    ("forced open\n</think>\nThe answer", True, "forced open", "The answer"),
    ("<think>x</think>a</think>b", False, "x", "a</think>b"),
]


@pytest.mark.parametrize(("text", "forced", "reasoning", "answer"), CASES)
def test_the_split_of_a_whole_reply(text: str, forced: bool, reasoning: str | None, answer: str) -> None:
    assert split_reasoning(text, forced_open=forced) == (reasoning, answer)


@pytest.mark.parametrize(("text", "forced", "reasoning", "answer"), CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 1000])
def test_streamed_pieces_reassemble_to_the_split(text: str, forced: bool, reasoning: str | None, answer: str,
                                                 size: int) -> None:
    splitter = ReasoningSplitter(forced_open=forced)
    pieces = [p for i in range(0, len(text), size) for p in splitter.feed(text[i:i + size])] + splitter.finish()
    assert "".join(p.text for p in pieces if isinstance(p, Reasoning)) == (reasoning or "")
    assert "".join(p for p in pieces if isinstance(p, str)) == answer
    assert all(p if isinstance(p, str) else p.text for p in pieces)  # no empty pieces
    seen_answer = False
    for piece in pieces:  # reasoning first, then the answer: never interleaved
        seen_answer = seen_answer or isinstance(piece, str)
        assert not (seen_answer and isinstance(piece, Reasoning))


def test_every_split_point_of_a_reply() -> None:
    text = "<think>\nStep one. Step two.\n</think>\n\nThe answer is 4."
    for cut in range(len(text) + 1):
        splitter = ReasoningSplitter()
        pieces = splitter.feed(text[:cut]) + splitter.feed(text[cut:]) + splitter.finish()
        assert [type(p) for p in pieces][:1] == [Reasoning]
        assert "".join(p for p in pieces if isinstance(p, str)) == "The answer is 4."


def test_the_request_field() -> None:
    assert parse_reasoning_format({}, "deepseek") is True
    assert parse_reasoning_format({}, "none") is False
    assert parse_reasoning_format({"reasoning_format": "none"}, "deepseek") is False
    assert parse_reasoning_format({"reasoning_format": "auto"}, "none") is True
    with pytest.raises(InvalidRequest) as error:
        parse_reasoning_format({"reasoning_format": "parsed"}, "deepseek")
    assert error.value.param == "reasoning_format"
