"""Tools in the engine: the template probe, tools and history in the prompt, and call grammars that hold
sampled calls to their schemas (forced from the first token, or lazily after free text)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.text.chat_template import ChatTemplate
from worker.engine.text.tools import (
    CallTags,
    Tool,
    ToolTemplateSupport,
    call_grammar,
    prepare_messages,
    probe,
)

jsonschema = pytest.importorskip("jsonschema")

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 9}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [Tool("get_weather", "The weather now", json.dumps(CITY)), Tool("add", "", json.dumps(ADD))]
TAGS = CallTags("<tool_call>", "</tool_call>")  # the wire contract's (shared/tool_call_tags.py), as a worker passes
CALL = re.compile(r"<tool_call>\n?(\{.*?\})\n?</tool_call>", re.S)
# A Hermes/Qwen-style template: renders tools with the <tool_call> instruction, calls and tool results.
NATIVE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}"
    "Call them as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_probe_tells_native_templates_from_others(tiny_chat_engine: Any) -> None:
    assert probe(tiny_chat_engine.chat_template, TAGS) == ToolTemplateSupport(tools=False, history=False)  # plain ChatML
    assert probe(ChatTemplate(NATIVE), TAGS) == ToolTemplateSupport(tools=True, history=True)


def test_a_template_without_tools_gets_them_as_text(tiny_chat_engine: Any) -> None:
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}]},
               {"role": "tool", "tool_call_id": "c1", "content": "-3C"}]
    messages, tools = prepare_messages(history, TOOLS, ToolTemplateSupport(False, False), TAGS)
    assert tools is None and messages[0]["content"].startswith("Be brief.\n\nYou can call")
    assert '"name": "get_weather"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[2] == {"role": "assistant",
                           "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'}
    assert messages[3] == {"role": "user", "content": "<tool_response>\n-3C\n</tool_response>"}
    assert tiny_chat_engine.encode_chat(history, tools=TOOLS, tool_call_tags=TAGS)  # renders and tokenizes


def test_a_native_template_gets_tools_and_history_as_they_are() -> None:
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 1}'}]}]
    messages, tools = prepare_messages(history, TOOLS, ToolTemplateSupport(True, True), TAGS)
    text = ChatTemplate(NATIVE).render(messages, tools=tools)
    assert "Tools: get_weather add" in text and '<tool_call>add {"a": 1}</tool_call>' in text


def _sample(engine: Any, mode: str, parallel: bool, seed: int) -> tuple[str, str]:
    params = GenerationParams(max_tokens=400, sampling=SamplingParams(temperature=1.0, seed=seed),
                              constraint=call_grammar(TOOLS, mode, parallel, TAGS))  # type: ignore[arg-type]
    gen = engine.new_generation([5, 6], params)
    rows = np.random.default_rng(seed).standard_normal((400, engine.model.config.vocab_size)).astype(np.float32)
    text = ""
    for row in rows:
        out = gen.accept_logits(row)
        text += out.text
        if out.finish_reason:
            return text, out.finish_reason
    raise AssertionError("never finished")


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_always_match_their_tools(tiny_engine: Any, seed: int, parallel: bool) -> None:
    text, reason = _sample(tiny_engine, "required", parallel, seed)
    calls = [json.loads(body) for body in CALL.findall(text)]
    assert calls and text.startswith("<tool_call>")
    rest = CALL.sub("", text).strip()  # what is not a finished call
    if reason == "length":  # random weights may go on calling until max_tokens: only an unfinished call is left
        assert parallel and rest.startswith("<tool_call>")
    else:
        assert rest == "" and (parallel or len(calls) == 1)
    for call in calls:
        jsonschema.validate(call["arguments"], {"get_weather": CITY, "add": ADD}[call["name"]])


def test_auto_lets_text_through_and_holds_calls_to_their_schemas(tiny_engine: Any) -> None:
    gen = tiny_engine.new_generation([5], GenerationParams(max_tokens=50, constraint=call_grammar(TOOLS, "auto", True, TAGS)))
    tokenizer = tiny_engine.tokenizer
    for token in tokenizer.encode('Let me check. <tool_call>{"name": "add", "arguments": {"a": ', add_bos=False):
        gen.constraint.advance(token)
    allowed = {tokenizer.token_bytes(int(t)) for t in gen.constraint.allowed()}
    assert allowed <= {bytes([d]) for d in b"0123456789"} | {b" ", b"\n"}  # the schema holds from the trigger on
    plain = tiny_engine.new_generation([5], GenerationParams(max_tokens=50, constraint=call_grammar(TOOLS, "auto", True, TAGS)))
    for token in tokenizer.encode("No tool is needed: 2 < 3 <tool", add_bos=False):
        plain.constraint.advance(token)
    assert set(tokenizer.eog_token_ids) & set(plain.constraint.allowed().tolist())  # a plain answer may end
