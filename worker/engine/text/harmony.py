"""OpenAI's harmony chat format (gpt-oss): conversations into its template, and the grammars that hold its replies.

A harmony reply is a run of messages, each `<|channel|>NAME<|message|>TEXT` closed by `<|end|>` and followed by
`<|start|>assistant` (the generation prompt already ends with `<|start|>assistant`): `analysis` is the reasoning,
`commentary` without a recipient a preamble shown to the user, `final` the answer (ended by `<|return|>`), and a
tool call is a commentary message addressed to `functions.NAME`, with the recipient after the channel or before it
(`<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}` ended by `<|call|>`). A template
is harmony when its source has `<|channel|>`, as llama.cpp tells it (common/chat.cpp).

Conversations go to the template natively, as llama.cpp's gpt-oss handler passes them: an assistant turn's
reasoning as `thinking`, its content dropped when it also carries tool calls and reasoning, call arguments as
objects. Structured output and forced tool calls are llguidance grammars over the whole reply, as llama.cpp's
gpt-oss grammar is (common/parsers/gpt-oss.cpp): any analysis (and, with tools, preamble) messages first, then the
final message's JSON, or a call whose arguments match its tool's schema; an output constraint of any kind becomes
the final message's body through an llguidance grammar reference.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from worker.engine.text.constraints import JSON_WHITESPACE, Constraint, grammar_of, narrow_schema
from worker.engine.text.tools import Tool, ToolMode, native_message

CHANNEL = "<|channel|>"  # a template with it is harmony (llama.cpp's test)
# Lark rules shared by every harmony grammar: what may come before the final message or the call. Each marker and
# word is its own literal: llguidance's lexer is greedy, so a literal spanning two of them ("<|channel|>analysis")
# would commit to its path where another rule goes on differently after the same first marker.
_MESSAGES = (
    'next: "<|start|>" "assistant"\n'
    'analysis: "<|channel|>" "analysis" "<|message|>" text\n'
    'preamble: "<|channel|>" "commentary" "<|message|>" text\n'
    'text[stop="<|end|>"]: /(.|\\n)*/\n'
    'constrain: " " "<|constrain|>"? "json"\n'  # the content type (free in the parser; JSON bodies here)
    'channel: "<|channel|>" ("commentary" | "analysis")\n'
    'final_head: "<|channel|>" "final" constrain? "<|message|>"\n'
)


def is_harmony(template_source: str) -> bool:
    """Whether a chat template writes the harmony format (its source has `<|channel|>`)."""
    return CHANNEL in template_source


def harmony_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the harmony template reads them: `reasoning` as `thinking` (an assistant turn with calls and
    reasoning loses its content, as llama.cpp drops it), tool calls with arguments as objects."""
    out = []
    for message in messages:
        prepared = native_message({k: v for k, v in message.items() if k != "reasoning"})
        reasoning = message.get("reasoning")
        if message.get("role") == "assistant" and isinstance(reasoning, str):
            prepared["thinking"] = reasoning
            if message.get("tool_calls"):
                prepared.pop("content", None)
        out.append(prepared)
    return out


def answer_constraint(inner: Constraint) -> Constraint:
    """Structured output in the final channel: analysis messages, then `<|channel|>final` (an optional constraint
    type) `<|message|>` and the body `inner` describes."""
    lark = ('start: (analysis next)* final\n'
            'final: final_head @answer\n' + _MESSAGES)
    return Constraint("llguidance", _top_level(lark, grammar_of(inner)))


def call_constraint(tools: Sequence[Tool], mode: ToolMode) -> Constraint:
    """Tool calls in harmony: analysis and preamble messages, then one call (required, or a named tool alone) or
    either a call or a free final message (auto); each call's arguments held to its tool's schema."""
    calls = " | ".join(f"call_{i}" for i in range(len(tools)))
    rules = [f'call_{i}: (" to=" "functions." {json.dumps(t.name)} channel constrain? "<|message|>" '
             f'| channel " to=" "functions." {json.dumps(t.name)} constrain? "<|message|>") '
             f'%json {json.dumps(_arguments(t))}' for i, t in enumerate(tools)]
    ending = "call" if mode == "required" else "call | final"
    lark = (f"start: ((analysis | preamble) next)* ({ending})\n"
            'final: final_head /(.|\\n)*/\n'
            f"call: {calls}\n" + "\n".join(rules) + "\n" + _MESSAGES)
    return Constraint("llguidance", json.dumps({"grammars": [{"name": "harmony", "lark_grammar": lark}]}))


def _arguments(tool: Tool) -> dict[str, Any]:
    """A tool's arguments schema as its call grammar holds it (narrowed, whitespace bounded)."""
    schema = narrow_schema(json.loads(tool.parameters))
    return {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE, "lenient": not tool.strict}}


def _top_level(lark: str, inner: str) -> str:
    """An llguidance top-level grammar: the harmony Lark grammar first, `inner` (a compiled grammar: top-level JSON
    or Lark text) as the grammar it names `@answer`."""
    if inner.lstrip().startswith("{"):
        answer = dict(json.loads(inner)["grammars"][0])
    else:
        answer = {"lark_grammar": inner}
    answer["name"] = "answer"
    return json.dumps({"grammars": [{"name": "harmony", "lark_grammar": lark}, answer]})
