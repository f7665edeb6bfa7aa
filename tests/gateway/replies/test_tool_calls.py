"""The tool-call parser: however the text is split, streamed items reassemble to the whole reply's split."""

from __future__ import annotations

import pytest

from gateway.replies.tool_calls import (
    ArgumentsDelta,
    CallStart,
    SplitReply,
    ToolCallParser,
    dropped_headers,
    split_ended_reply,
    split_reply,
    tool_finish,
)

REPLIES = [
    "Hello there.\n",
    'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris\\""}}\n</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"a": [1, {"b": 2}]}}</tool_call>',
    "a < b <tool",
    '<tool_call>{"name": "x", "arguments": {"q": 1',  # cut short by max_tokens
]


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_streamed_items_reassemble_to_the_whole_reply(text: str, size: int) -> None:
    content, calls = split_reply(text)
    parser = ToolCallParser()
    items = [item for i in range(0, len(text), size) for item in parser.feed(text[i : i + size])] + parser.finish()
    streamed = "".join(item for item in items if isinstance(item, str))
    assert ((streamed or None) if calls else streamed) == content
    names = [item.name for item in items if isinstance(item, CallStart)]
    arguments = ["".join(x.text for x in items if isinstance(x, ArgumentsDelta) and x.index == i)
                 for i in range(len(names))]
    assert list(zip(names, arguments)) == [(c["name"], c["arguments"]) for c in calls]
    if "<tool_call>" in text:
        assert "<" not in streamed  # a tag, whole or partial, is never content


def test_the_split_of_a_reply() -> None:
    assert split_reply(REPLIES[0]) == ("Hello there.\n", [])
    content, calls = split_reply(REPLIES[1])
    assert content == "Sure."
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city": "Pa}ris\\""}'),
                                                            ("add", '{"a": [1, {"b": 2}]}')]
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)
    assert split_reply(REPLIES[2]) == ("a < b <tool", [])


TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "London", "days": [1, 2]}}\n</tool_call>')


@pytest.mark.parametrize("cut", range(len(TWO_CALLS) + 1))
def test_a_call_cut_short_is_dropped_and_its_complete_predecessors_kept(cut: int) -> None:
    import json

    text = TWO_CALLS[:cut]
    first_done = TWO_CALLS.index("}}") + 1  # the first call's arguments close here
    second_done = TWO_CALLS.rindex("]}") + 2
    content, calls = split_reply(text)
    assert all(isinstance(json.loads(call["arguments"]), dict) for call in calls)
    expected = [{"city": "Paris"}] * (cut >= first_done) + [{"city": "London", "days": [1, 2]}] * (cut >= second_done)
    assert [json.loads(call["arguments"]) for call in calls] == expected
    if cut >= len("<tool_call>"):
        assert not content  # the text of a dropped call never becomes content


@pytest.mark.parametrize("size", [1, 2, 5, 13])
def test_a_stream_never_sends_a_fragment_of_a_call_it_drops(size: int) -> None:
    import json

    text = TWO_CALLS[: TWO_CALLS.index('"London"') + 4]  # the second call's arguments are cut inside a string
    parser = ToolCallParser()
    items = [item for i in range(0, len(text), size) for item in parser.feed(text[i : i + size])] + parser.finish()
    starts = [item for item in items if isinstance(item, CallStart)]
    deltas = [item for item in items if isinstance(item, ArgumentsDelta)]
    assert [s.index for s in starts] == [0] and [d.index for d in deltas] == [0]
    assert json.loads(deltas[0].text) == {"city": "Paris"} and [c["id"] for c in parser.calls] == [starts[0].id]
    assert items.index(starts[0]) < items.index(deltas[0]) and not [i for i in items if isinstance(i, str)]


def test_closed_arguments_that_are_not_json_are_no_call() -> None:
    content, calls = split_reply('<tool_call>{"name": "f", "arguments": {city: Paris}}</tool_call>')
    assert calls == [] and not content


@pytest.mark.parametrize("cut", range(len(TWO_CALLS) + 1))
def test_a_turn_cut_only_in_a_further_call_ends_as_tool_calls(cut: int) -> None:
    """Issue 42: with a complete call, a max_tokens cut that only drops a further call (or the last closing tag)
    is a finished tool turn; with none complete it stays "length". Whole or streamed, the same."""
    text = TWO_CALLS[:cut]
    first_done = TWO_CALLS.index("}}") + 1
    second_open = TWO_CALLS.index("<tool_call>", 1)
    second_done = TWO_CALLS.rindex("]}") + 2
    split = split_ended_reply(text, "length")
    assert split.finish_reason == ("tool_calls" if cut >= first_done else "length")
    # a call begun: from its whole tag on (a partial first tag is text), or after a call from its first "<"
    cut_inside_a_call = len("<tool_call>") <= cut < first_done or second_open < cut < second_done
    assert split.dropped == int(cut_inside_a_call), (cut, text)
    parser = ToolCallParser()
    for i in range(0, len(text), 3):
        parser.feed(text[i : i + 3])
    parser.finish()
    assert (tool_finish("length", parser), parser.dropped) == (split.finish_reason, split.dropped)


def test_text_after_calls_cut_short_stays_length_and_a_stopped_reply_is_tool_calls() -> None:
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert split_ended_reply(call + " and then some words", "length").finish_reason == "length"
    assert split_ended_reply(call, "stop").finish_reason == "tool_calls"
    assert split_ended_reply("plain", "length").finish_reason == "length"
    assert split_ended_reply("", "stop") == SplitReply("", [], "stop", 0)
    assert dropped_headers(0) == {} and dropped_headers(2) == {"x-llmfleet-dropped-tool-calls": "2"}
