"""The tool-call parser: however the text is split, streamed items reassemble to the whole reply's split."""

from __future__ import annotations

import pytest

from gateway.tool_output import ArgumentsDelta, CallStart, ToolCallParser, split_reply

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
