"""Batch input validation: what OpenAI refuses at batch creation is a 400 naming the line and the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batches.input import parse_input
from shared.errors import InvalidRequest


def line(custom_id: str = "a", url: str = "/v1/chat/completions", **overrides: Any) -> dict[str, Any]:
    item = {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    item.update(overrides)
    return item


def jsonl(*items: Any) -> bytes:
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items).encode()


def parse(data: bytes, max_lines: int = 100, max_body_bytes: int = 10_000):
    return parse_input(data, max_lines=max_lines, max_body_bytes=max_body_bytes)


def test_lines_keep_their_order_ids_urls_and_bodies_and_blank_lines_are_skipped() -> None:
    lines = parse(jsonl(line("x"), "", "   ", line("y", url="/v1/embeddings", body={"model": "m", "input": "t"}),
                        line("z", url="/v1/completions", body={"prompt": "p"})))
    assert [(item.index, item.custom_id, item.url) for item in lines] == [
        (0, "x", "/v1/chat/completions"), (1, "y", "/v1/embeddings"), (2, "z", "/v1/completions")]
    assert lines[1].body == {"model": "m", "input": "t"}


@pytest.mark.parametrize(("item", "param", "words"), [
    ("{not json", None, "not valid JSON"),
    ("[1, 2]", None, "JSON object"),
    ('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"x": NaN}}', None,
     "not valid JSON"),
    (line(custom_id=""), "custom_id", "non-empty string"),
    (line(custom_id=7), "custom_id", "non-empty string"),
    (line(custom_id="x" * 513), "custom_id", "longer than 512"),
    (line(method="GET"), "method", "'POST'"),
    (line(url="/v1/responses"), "url", "/v1/chat/completions, /v1/completions, /v1/embeddings"),
    (line(url="/chat/completions"), "url", "must be one of"),
    (line(body=None), "body", "JSON object"),
    (line(body=["x"]), "body", "JSON object"),
    (line(body={"model": "m", "prompt": "x" * 20_000}), "body", "larger than the limit of 10000 bytes"),
    ('{"custom_id": "a\\ud800", "method": "POST", "url": "/v1/completions", "body": {}}', None, "surrogate"),
])
def test_a_bad_line_is_a_400_naming_the_line_and_field(item: Any, param: str | None, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(jsonl(line("first"), item))
    assert caught.value.status == 400 and caught.value.param == param
    assert caught.value.message.startswith("Line 2 of the input file: ") and words in caught.value.message


def test_custom_ids_must_be_unique() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(jsonl(line("a"), line("b"), line("a")))
    assert caught.value.param == "custom_id" and "Line 3" in caught.value.message and "unique" in caught.value.message


def test_line_count_is_bounded_and_an_empty_file_is_refused() -> None:
    assert len(parse(jsonl(*(line(str(i)) for i in range(3))), max_lines=3)) == 3
    with pytest.raises(InvalidRequest, match="more than 3 requests"):
        parse(jsonl(*(line(str(i)) for i in range(4))), max_lines=3)
    with pytest.raises(InvalidRequest, match="no requests"):
        parse(b"\n  \n")


def test_text_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="UTF-8") as caught:
        parse(b"\xff\xfe" + jsonl(line()))
    assert caught.value.param == "input_file_id"
