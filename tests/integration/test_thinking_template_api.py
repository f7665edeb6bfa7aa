"""A reasoning model's thinking block end to end, on real processes (Redis, a gateway, a SmolLM2 worker), with the
unmodified openai, anthropic and ollama clients.

No small reasoning model ships on PyPI, so SmolLM2 is made one by its chat template (LLMFLEET_CHAT_TEMPLATE): the
generation prompt opens `<think>\\n` (as Qwen3 and newer DeepSeek-R1 templates do; `enable_thinking=false` leaves
it out) after a one-shot example of a block and its answer, so that SmolLM2, greedy, writes a short thought,
closes it with `</think>` itself and answers. The worker detects the template (its registry entry says the reply
starts inside the block) and each API returns the thought in its own field: chat's `reasoning_content` (and
`delta.reasoning_content`), the Responses API's reasoning item, Ollama's `message.thinking`, Anthropic's
`thinking` block. Greedy replies to the same prompt are compared across the APIs (they make the same jobs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmfleet.local_cluster import LocalCluster
from tests.support.cluster import start_process_cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
QUESTION = "What is the capital of France?"
ASK = [{"role": "user", "content": QUESTION}]
MAX_TOKENS = 80
THINKING_TEMPLATE = (
    "{{- '<|im_start|>system\\nYou are a helpful assistant. You think step by step inside <think> and </think>, "
    "then give a short answer.<|im_end|>\\n' -}}"
    "{{- '<|im_start|>user\\nIs fire hot?<|im_end|>\\n<|im_start|>assistant\\n<think>\\nFire burns things, so it "
    "is hot.\\n</think>\\n\\nYes, fire is hot.<|im_end|>\\n' -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is not defined or enable_thinking -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
GREEDY = {"temperature": 0}  # the anthropic SDK has no sampling arguments; the gateway reads the field


@pytest.fixture(scope="module")
def thinking_cluster(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Redis, a gateway and one SmolLM2 worker whose chat template opens a thinking block."""
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    running = start_process_cluster(tmp_path_factory.mktemp("thinking-logs"), 1,
                                    LLMFLEET_CHAT_TEMPLATE=str(template), LLMFLEET_HOST="127.0.0.1",
                                    LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="5",
                                    LLMFLEET_LOG_LEVEL="WARNING")
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def client(thinking_cluster: LocalCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=thinking_cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def split(client: openai.OpenAI) -> Any:
    """The greedy chat reply with its thinking split off (what every other API is compared with)."""
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0)


@pytest.fixture(scope="module")
def unthinking(client: openai.OpenAI) -> Any:
    """The greedy chat reply with thinking turned off (enable_thinking=false: the prompt opens no block)."""
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body=OFF)


def _no_tags(*texts: str) -> bool:
    return not any("<think>" in text or "</think>" in text for text in texts)


def test_chat_returns_the_thinking_apart_from_the_answer(client: openai.OpenAI, split: Any) -> None:
    message = split.choices[0].message
    reasoning: str = message.reasoning_content  # type: ignore[attr-defined]
    assert reasoning and message.content and _no_tags(reasoning, message.content), message
    assert split.choices[0].finish_reason == "stop"
    raw = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                         extra_body={"reasoning_format": "none"}).choices[0].message
    assert getattr(raw, "reasoning_content", None) is None
    assert raw.content == f"{reasoning}\n</think>\n\n{message.content}"  # the prompt opened the block


def test_streamed_deltas_carry_the_thinking_first(client: openai.OpenAI, split: Any) -> None:
    reasoning, content, order = "", "", []
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        piece = getattr(delta, "reasoning_content", None)
        if piece:
            reasoning, order = reasoning + piece, [*order, "reasoning"]
        if delta.content:
            content, order = content + delta.content, [*order, "content"]
    message = split.choices[0].message
    assert (reasoning, content) == (message.reasoning_content, message.content)  # type: ignore[attr-defined]
    assert order == sorted(order, key=lambda kind: kind == "content") and len(set(order)) == 2


def test_enable_thinking_false_turns_it_off(split: Any, unthinking: Any) -> None:
    message = unthinking.choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    assert message.content and _no_tags(message.content)
    assert unthinking.usage.prompt_tokens < split.usage.prompt_tokens  # the template left `<think>` out


def test_ollama_thinking_follows_think(thinking_cluster: LocalCluster, split: Any, unthinking: Any) -> None:
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=thinking_cluster.base_url, timeout=180)
    options = {"temperature": 0, "num_predict": MAX_TOKENS}
    on = client.chat(model=MODEL, messages=ASK, think=True, options=options).message
    expected = split.choices[0].message
    assert (on.thinking, on.content) == (expected.reasoning_content, expected.content)  # type: ignore[attr-defined]
    thinking, content = "", ""
    for part in client.chat(model=MODEL, messages=ASK, think=True, options=options, stream=True):
        thinking += part.message.thinking or ""
        content += part.message.content or ""
    assert (thinking, content) == (on.thinking, on.content)
    off = client.chat(model=MODEL, messages=ASK, think=False, options=options).message
    assert not off.thinking and off.content == unthinking.choices[0].message.content


def test_anthropic_thinking_block(thinking_cluster: LocalCluster, client: openai.OpenAI, unthinking: Any) -> None:
    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=thinking_cluster.base_url, api_key="unused", max_retries=0, timeout=180)
    budget = MAX_TOKENS - 20
    twin = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body={"thinking_budget_tokens": budget}).choices[0].message
    on = claude.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": budget})
    assert [block.type for block in on.content] == ["thinking", "text"], on.content
    assert on.content[0].thinking == twin.reasoning_content  # type: ignore[attr-defined, union-attr]
    assert on.content[1].text == twin.content  # type: ignore[union-attr]
    with claude.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": budget}) as stream:
        kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert [block.model_dump() for block in streamed.content] == [block.model_dump() for block in on.content]
    assert "thinking_delta" in kinds and kinds.index("thinking_delta") < kinds.index("text_delta")
    off = claude.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, extra_body=GREEDY,
                                 thinking={"type": "disabled"})
    assert [block.type for block in off.content] == ["text"]
    assert off.content[0].text == unthinking.choices[0].message.content  # type: ignore[union-attr]


def _reasoning_text(item: Any) -> str:
    return "".join(part["text"] for part in item.model_dump()["content"] if part["type"] == "reasoning_text")


def test_responses_api_reasoning_item(client: openai.OpenAI, split: Any, unthinking: Any) -> None:
    response = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=MAX_TOKENS, temperature=0)
    assert [item.type for item in response.output] == ["reasoning", "message"], response.output
    expected = split.choices[0].message
    assert _reasoning_text(response.output[0]) == expected.reasoning_content  # type: ignore[attr-defined]
    assert response.output_text == expected.content
    with client.responses.stream(model=MODEL, input=QUESTION, max_output_tokens=MAX_TOKENS,
                                 temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == _reasoning_text(final.output[0]) == _reasoning_text(response.output[0])
    assert final.output_text == response.output_text
    off = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=MAX_TOKENS, temperature=0,
                                  extra_body=OFF)
    assert [item.type for item in off.output] == ["message"]
    assert off.output_text == unthinking.choices[0].message.content
