"""The harmony reply parser (gpt-oss): however a reply is cut into pieces, the streamed pieces reassemble to the
whole reply's split (reasoning, content, tool calls, as llama-server maps them), and no marker reaches the client."""

from __future__ import annotations

import json

import pytest

from gateway.replies.harmony import HarmonyParser, parse_header
from gateway.replies.parser import ReplyParser, whole_reply
from gateway.replies.reasoning import Reasoning
from gateway.replies.tool_calls import ArgumentsDelta, CallStart

THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
NEXT = "<|start|>assistant"
FINAL = "<|channel|>final<|message|>It is sunny in Paris."
CALL_IN_CHANNEL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
CALL_IN_ROLE = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}'
MARKERS = ("<|", "|>", "channel", "analysis", "commentary")

CASES = [  # (reply, reasoning, content, calls as (name, arguments))
    (THINK + NEXT + FINAL, "The user wants the weather.", "It is sunny in Paris.", []),
    (FINAL, None, "It is sunny in Paris.", []),
    (THINK + NEXT + CALL_IN_CHANNEL, "The user wants the weather.", "", [("get_weather", '{"city": "Paris"}')]),
    (THINK + NEXT + CALL_IN_ROLE, "The user wants the weather.", "", [("get_weather", '{"city":"Paris"}')]),
    (CALL_IN_ROLE, None, "", [("get_weather", '{"city":"Paris"}')]),
    (THINK + NEXT + "<|channel|>commentary<|message|>Let me check.<|end|>" + NEXT + CALL_IN_CHANNEL,
     "The user wants the weather.", "Let me check.", [("get_weather", '{"city": "Paris"}')]),
    ("<|channel|>analysis<|message|>one<|end|>" + NEXT + "<|channel|>analysis<|message|>two<|end|>" + NEXT + FINAL,
     "onetwo", "It is sunny in Paris.", []),  # llama.cpp joins reasoning blocks as they come
    ("<|channel|>analysis<|message|>cut short by max_tok", "cut short by max_tok", "", []),
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>stray<|end|>" + NEXT + FINAL,
     "stray", "It is sunny in Paris.", []),  # gpt-oss-20b's stray commentary prefix
    (THINK + NEXT + "<|channel|>commentary to=browser.search json<|message|>{\"q\": 1}", "The user wants the weather.",
     "", []),  # a built-in tool's call: dropped
    ("Plain text <|end|> is content", None, "Plain text <|end|> is content", []),
    ("to the moon", None, "to the moon", []),
    ("", None, "", []),
    (THINK + NEXT + "<|chan", "The user wants the weather.", "", []),  # a header cut short
    ("<|channel|>final <|constrain|>json<|message|>{\"a\": 1}", None, '{"a": 1}', []),
    ("<|channel|>analysis<|message|>a < b and <|en is not the end<|end|>" + NEXT + FINAL,
     "a < b and <|en is not the end", "It is sunny in Paris.", []),
]


def _run(text: str, size: int, *, reasoning: bool = True, tools: bool = True) -> tuple[HarmonyParser, list]:
    parser = HarmonyParser(reasoning=reasoning, tools=tools)
    parts = [p for i in range(0, len(text), size) for p in parser.feed(text[i:i + size])] + parser.finish()
    return parser, parts


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_streamed_pieces_reassemble_to_the_split(text: str, reasoning: str | None, content: str,
                                                 calls: list[tuple[str, str]], size: int) -> None:
    parser, parts = _run(text, size)
    assert "".join(p.text for p in parts if isinstance(p, Reasoning)) == (reasoning or "")
    assert parser.reasoning == reasoning
    assert "".join(p for p in parts if isinstance(p, str)) == content
    assert [(c["name"], c["arguments"]) for c in parser.calls] == calls
    starts = [p for p in parts if isinstance(p, CallStart)]
    assert [(s.name, s.index) for s in starts] == [(name, i) for i, (name, _) in enumerate(calls)]
    assert [p.text for p in parts if isinstance(p, ArgumentsDelta)] == [arguments for _, arguments in calls]
    assert all(p if isinstance(p, str) else getattr(p, "text", True) for p in parts)  # no empty pieces
    if text.startswith(("<|", " to=")):
        for piece in (p for p in parts if isinstance(p, str | Reasoning)):
            shown = piece if isinstance(piece, str) else piece.text
            assert not any(marker in shown for marker in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>"))


def test_reasoning_off_keeps_the_analysis_message_in_the_content() -> None:
    """llama-server's reasoning_format none: the analysis message, markers and all, then the final's text."""
    parser, parts = _run(THINK + NEXT + FINAL, 3, reasoning=False)
    assert not any(isinstance(p, Reasoning) for p in parts) and parser.reasoning is None
    assert "".join(p for p in parts if isinstance(p, str)) == THINK + "It is sunny in Paris."


def test_without_tools_a_call_is_dropped_and_content_stays() -> None:
    parser, parts = _run(THINK + NEXT + CALL_IN_CHANNEL, 5, tools=False)
    assert parser.calls == [] and not any(isinstance(p, CallStart) for p in parts)
    assert "".join(p for p in parts if isinstance(p, str)) == ""


@pytest.mark.parametrize("cut", [len(THINK + NEXT + CALL_IN_CHANNEL) - 1, len(THINK + NEXT) + 20])
def test_a_call_cut_short_is_dropped(cut: int) -> None:
    parser, parts = _run((THINK + NEXT + CALL_IN_CHANNEL)[:cut], 4)
    assert parser.calls == [] and not any(isinstance(p, CallStart | ArgumentsDelta) for p in parts)
    assert parser.dropped == (1 if cut > len(THINK + NEXT + CALL_IN_CHANNEL) - 20 else 0)


def test_arguments_that_are_not_an_object_are_no_call() -> None:
    parser, _ = _run(THINK + NEXT + "<|channel|>commentary to=functions.f<|message|>[1, 2]", 1000)
    assert parser.calls == [] and parser.dropped == 1


def test_headers() -> None:
    header = parse_header(" to=functions.get_weather<|channel|>commentary json")
    assert (header.channel, header.recipient) == ("commentary", "functions.get_weather")
    header = parse_header("<|start|>assistant<|channel|>commentary to=functions.x <|constrain|>json")
    assert (header.channel, header.recipient, header.raw) == ("commentary", "functions.x",
                                                              "<|channel|>commentary to=functions.x <|constrain|>json")
    assert parse_header("<|channel|>commentary to=assistant<|channel|>analysis").recipient is None


def test_the_reply_parser_takes_the_harmony_format() -> None:
    parser = ReplyParser(reasoning=True, tools=True, reply_format="harmony")
    parts = parser.feed(THINK + NEXT) + parser.feed(CALL_IN_CHANNEL) + parser.finish()
    assert parts[0] == Reasoning("The user wants the weather.")
    assert [type(p) for p in parts[1:]] == [CallStart, ArgumentsDelta]
    assert parser.finish_reason("stop") == "tool_calls" and parser.calls[0]["name"] == "get_weather"


def test_a_whole_harmony_reply() -> None:
    reply = whole_reply(THINK + NEXT + FINAL, "stop", reasoning=True, tools=True, reply_format="harmony")
    assert (reply.reasoning, reply.content, reply.calls, reply.finish_reason) == (
        "The user wants the weather.", "It is sunny in Paris.", [], "stop")
    reply = whole_reply(THINK + NEXT + CALL_IN_ROLE, "stop", reasoning=True, tools=True, reply_format="harmony")
    assert reply.content is None and reply.finish_reason == "tool_calls"
    assert json.loads(reply.calls[0]["arguments"]) == {"city": "Paris"}
