"""The harmony format in the engine (gpt-oss): conversations as its template reads them, and the grammars that hold
a reply's channels (structured output in the final channel, tool calls as commentary messages to functions.X),
token by token over a harmony vocabulary and end to end over SmolLM2 with gpt-oss's tokenizer keys."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from bench.gpt_oss_tokens import gpt_oss_tokenizer_fields
from tests.worker.engine.text.test_tokenizer import tiny_gpt2_metadata
from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.engine import Engine
from worker.engine.text.constraints import Constraint, ConstraintError, GrammarCompiler
from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf
from worker.engine.text.harmony import answer_constraint, call_constraint, harmony_messages, is_harmony
from worker.engine.text.tools import Tool
from worker.local_generation import generate

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
TOOLS = [Tool("get_weather", "Weather", json.dumps(CITY)), Tool("get_time", "Time", '{"type":"object"}')]
ANSWER = answer_constraint(Constraint("json_schema", json.dumps(CITY)))
THINK = "<|channel|>analysis<|message|>Paris, then.<|end|><|start|>assistant"


TOKENIZER = tokenizer_from_gguf(gpt_oss_tokenizer_fields(tiny_gpt2_metadata()))  # with gpt-oss's special tokens


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    """llguidance over the tiny byte-level vocabulary with gpt-oss's special tokens."""
    return GrammarCompiler(TOKENIZER, TOKENIZER.vocab_size)


def _accepts(compiler: GrammarCompiler, constraint: Constraint, text: str) -> bool:
    """Whether the grammar takes every token of text, and may end after it."""
    matcher = compiler.new_sequence(constraint)
    for token in TOKENIZER.encode(text, add_bos=False):
        try:
            matcher.advance(token)
        except ConstraintError:
            return False
    return matcher.accepting


def test_a_template_is_harmony_when_it_writes_channels() -> None:
    assert is_harmony("{{ '<|start|>assistant<|channel|>final<|message|>' }}")
    assert not is_harmony("{{ '<|im_start|>assistant' }}")


def test_messages_carry_reasoning_as_thinking_and_calls_natively() -> None:
    call = {"id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "ignored", "reasoning": "Call it.", "tool_calls": [call]},
                {"role": "assistant", "content": "Sunny.", "reasoning": "Say it."},
                {"role": "assistant", "content": "Plain."}]
    assert harmony_messages(messages) == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "thinking": "Call it.",  # llama.cpp drops the content of a call turn with reasoning
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": {"city": "Paris"}}}]},
        {"role": "assistant", "content": "Sunny.", "thinking": "Say it."},
        {"role": "assistant", "content": "Plain."}]


@pytest.mark.parametrize(("text", "ok"), [
    ('<|channel|>final<|message|>{"city": "Paris"}', True),
    (THINK + '<|channel|>final <|constrain|>json<|message|>{"city": "Paris"}', True),
    (THINK + THINK + '<|channel|>final json<|message|>{"city": "Rome"}', True),
    ('<|channel|>final<|message|>{"town": "Paris"}', False),  # the schema holds the final message
    ('<|channel|>commentary<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>{"city": "x"}', False),
    ("<|channel|>final<|message|>Paris", False),
])
def test_structured_output_is_the_final_channels_body(compiler: GrammarCompiler, text: str, ok: bool) -> None:
    assert _accepts(compiler, ANSWER, text) is ok


def test_any_constraint_kind_can_be_the_final_body(compiler: GrammarCompiler) -> None:
    regex = answer_constraint(Constraint("regex", "(yes|no)"))
    assert _accepts(compiler, regex, THINK + "<|channel|>final<|message|>yes")
    assert not _accepts(compiler, regex, "<|channel|>final<|message|>maybe")
    gbnf = answer_constraint(Constraint("grammar", 'root ::= "a" "b"*'))
    assert _accepts(compiler, gbnf, "<|channel|>final<|message|>abb")


@pytest.mark.parametrize(("text", "required", "auto"), [
    (THINK + '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}', True, True),
    (' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}', True, True),
    ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis to=functions.get_time"
     "<|message|>{}", True, True),
    ('<|channel|>commentary to=functions.get_weather<|message|>{"town": "Paris"}', False, False),
    ("<|channel|>commentary to=functions.unknown<|message|>{}", False, False),
    (THINK + "<|channel|>final<|message|>It is sunny.", False, True),
])
def test_tool_calls_are_commentary_messages_held_to_their_schema(compiler: GrammarCompiler, text: str,
                                                                 required: bool, auto: bool) -> None:
    assert _accepts(compiler, call_constraint(TOOLS, "required"), text) is required
    assert _accepts(compiler, call_constraint(TOOLS, "auto"), text) is auto


def _greedy(engine: Engine, messages: list[dict[str, Any]], params: GenerationParams,
            tools: list[Tool] | None = None) -> tuple[str, str | None]:
    ids = engine.encode_chat(messages, tools=tools or [])
    outputs = list(generate(engine, ids, params))
    return "".join(o.text for o in outputs), outputs[-1].finish_reason


def test_a_forced_call_and_a_json_answer_come_out_as_harmony(gpt_oss_engine: Engine) -> None:
    """SmolLM2 knows no harmony; the grammars make it write it (the markers as their own tokens, rendered)."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    text, reason = _greedy(gpt_oss_engine, ask, GenerationParams(
        max_tokens=60, sampling=SamplingParams(temperature=0), constraint=call_constraint(TOOLS[:1], "required")),
        TOOLS[:1])
    match = re.fullmatch(r"(?s).*to=functions\.get_weather.*<\|message\|>(.*)", text)
    assert match is not None and reason == "stop", text
    assert set(json.loads(match.group(1))) == {"city"}
    text, reason = _greedy(gpt_oss_engine, ask, GenerationParams(max_tokens=60, sampling=SamplingParams(temperature=0),
                                                                 constraint=ANSWER))
    match = re.fullmatch(r"(?s)(?:<\|channel\|>analysis<\|message\|>.*?<\|end\|><\|start\|>assistant)*"
                         r"<\|channel\|>final[^<]*(?:<\|constrain\|>json)?<\|message\|>(.*)", text)
    assert match is not None and reason == "stop", text
    assert set(json.loads(match.group(1))) == {"city"}
