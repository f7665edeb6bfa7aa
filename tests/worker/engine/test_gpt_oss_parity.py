"""gpt-oss's chat template and tokenizer against llama-server's (the reference): SmolLM2 with gpt-oss's tokenizer keys
(bench/gpt_oss_tokens.py) loaded by both; every conversation renders the same prompt text and the same prompt
tokens through our engine (Engine.render_chat / encode_chat, the served path) as through llama-server's
/apply-template and /tokenize, and texts tokenize alike with and without special-token parsing. Skipped with the
reason where llama-server is not built (../shared/peers/build-llama-server.sh)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.llama_oracle import LlamaServer, llama_server_binary
from worker.engine.engine import Engine
from worker.engine.text.tools import Tool

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "description": "the city"},
                                            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
TOOLS = [Tool("get_weather", "Current weather", json.dumps(WEATHER)), Tool("get_time", "The time", '{"type":"object"}')]
CALL = {"id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], list[Tool], dict[str, Any]]] = [
    ("system and user", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], [], {}),
    ("developer and tools", [{"role": "developer", "content": "Use tools."},
                             {"role": "user", "content": "Weather in Paris?"}], TOOLS, {}),
    ("a call with reasoning, and its result",
     [{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning": "I should call get_weather.", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], TOOLS, {}),
    ("a call whose content is its analysis",
     [{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"clear\"}"}], TOOLS, {}),
    ("earlier turns drop their reasoning",
     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning": "Greet back."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning": "Call it.", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
      {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks ü 日本"}], TOOLS, {}),
    ("reasoning effort", [{"role": "user", "content": "Think hard: 17 * 23?"}], [], {"reasoning_effort": "high"}),
]


def _openai(message: dict[str, Any]) -> dict[str, Any]:
    """A conversation message as an OpenAI client sends it (llama-server's input)."""
    out = {k: v for k, v in message.items() if k not in ("tool_calls", "reasoning")}
    if "reasoning" in message:
        out["reasoning_content"] = message["reasoning"]
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for c in message["tool_calls"]]
    return out


@pytest.fixture(scope="module")
def llama_server(gpt_oss_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-server on the same file, with its jinja templates."""
    if llama_server_binary() is None:
        pytest.skip("llama-server is not built (../shared/peers/build-llama-server.sh)")
    log = tmp_path_factory.mktemp("gpt-oss-server") / "llama-server.log"
    with LlamaServer(gpt_oss_gguf_path, "--jinja", log=log) as server:
        yield server


@pytest.mark.parametrize(("name", "messages", "tools", "kwargs"), CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
def test_prompts_render_the_same_tokens_as_llama_server(gpt_oss_engine: Engine, llama_server: LlamaServer, name: str,
                                                         messages: list[dict[str, Any]], tools: list[Tool],
                                                         kwargs: dict[str, Any]) -> None:
    assert gpt_oss_engine.harmony
    body: dict[str, Any] = {"messages": [_openai(m) for m in messages], **kwargs}
    if tools:
        body["tools"] = [t.openai() for t in tools]
    theirs = llama_server.apply_template(body)
    ours = gpt_oss_engine.render_chat(messages, tools=tools, template_kwargs=kwargs)
    assert ours == theirs
    assert gpt_oss_engine.encode_chat(messages, tools=tools, template_kwargs=kwargs) == llama_server.tokenize(theirs)


TEXTS = [
    "Hello WORLD it's McDonald's ÉCOLE été naïve 12345 1234567\n\n  x  \r\n/path//a\n",
    "don'T  I'LL  HELLO'S camelCaseWord XMLHttpRequest 日本語テキスト Ωmega ǅungla",
    "<|start|>assistant<|channel|>final <|constrain|>json<|message|>{\"a\": 1}<|end|><|return|><|call|>",
    "a\u00a0b\u2003c  \t\n\t d €100 ½ ²³ ١٢٣ x̃ñ 🙂🙂 ..!!?? --- ==>",
]


@pytest.mark.parametrize("parse_special", [True, False])
def test_texts_tokenize_as_llama_server_tokenizes_them(gpt_oss_engine: Engine, llama_server: LlamaServer,
                                                       parse_special: bool) -> None:
    for text in TEXTS:
        ours = gpt_oss_engine.tokenizer.encode(text, parse_special=parse_special, add_bos=False)
        assert ours == llama_server.tokenize(text, parse_special=parse_special), text
