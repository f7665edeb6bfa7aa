"""The thinking gate: a reasoning reply's structured output applies to the answer after `</think>`, not the thinking.

No small reasoning model ships on PyPI: SmolLM2 (its real tokenizer, where `</think>` is several tokens) is made
to write in that shape, by scripted tokens (the gate's masks step by step) or by a chat template whose generation
prompt opens the block and a thinking budget that closes it (real greedy generation, then the schema)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SampledToken, SamplingParams
from worker.engine.engine import Engine
from worker.engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from worker.engine.text.constraints import Constraint, ConstraintError
from worker.engine.text.thinking import has_thinking_tokens
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, RequestFailed, SequenceStep

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12}},
          "required": ["answer"], "additionalProperties": False}
JSON_ANSWER = Constraint("json_schema", json.dumps(SCHEMA))
THINKING_TEMPLATE = CHATML_TEMPLATE.replace("<|im_start|>assistant\\n", "<|im_start|>assistant\\n<think>\\n")


def _params(**fields: Any) -> GenerationParams:
    return GenerationParams(max_tokens=60, sampling=SamplingParams(temperature=0.0), constraint=JSON_ANSWER,
                            stop_after_thinking=True, answer_after_thinking=True, **fields)


def _take(gen: Any, engine: Engine, text: str) -> None:
    for token in engine.tokenizer.encode(text, parse_special=False, add_bos=False):
        gen.accept(SampledToken(token))


def _grammar_allowed(engine: Engine, answer_so_far: str) -> set[int]:
    plain = engine.grammars.new_sequence(JSON_ANSWER)
    for token in engine.tokenizer.encode(answer_so_far, parse_special=False, add_bos=False):
        plain.advance(token)
    return set(plain.allowed().tolist())


@pytest.mark.slow
def test_the_grammar_starts_after_the_block_closes(smollm2_engine: Engine) -> None:
    gen = smollm2_engine.new_generation([1, 2, 3], _params())
    vocab = smollm2_engine.model.config.vocab_size
    start = set(gen.constraint.allowed().tolist())  # the grammar's first tokens, and those that spell <think>
    assert _grammar_allowed(smollm2_engine, "") < start and len(start) < vocab // 10
    _take(gen, smollm2_engine, "<think>\nThe user wants JSON, not prose. Plain words here: no braces")
    assert gen.constraint.phase == "thinking"
    assert len(gen.constraint.allowed()) > vocab - 50  # only tokens that close the block with answer text are out
    _take(gen, smollm2_engine, ".\n</think>")
    assert gen.constraint.phase == "answer-start"
    after = set(gen.constraint.allowed().tolist())
    assert _grammar_allowed(smollm2_engine, "") < after  # the grammar, plus whitespace the splitter drops
    bad = smollm2_engine.tokenizer.encode("Sure", parse_special=False, add_bos=False)[0]
    assert bad not in after
    with pytest.raises(ConstraintError):
        gen.constraint.copy().advance(bad)
    _take(gen, smollm2_engine, "\n\n{\"answer\": \"yes\"}")
    assert gen.finish_reason == "stop" and gen.constraint.complete


@pytest.mark.slow
def test_a_reply_without_a_block_is_constrained_from_its_first_token(smollm2_engine: Engine) -> None:
    gen = smollm2_engine.new_generation([1, 2, 3], _params())
    _take(gen, smollm2_engine, "{\"answer\"")
    assert gen.constraint.phase == "answer"
    assert set(gen.constraint.allowed().tolist()) == _grammar_allowed(smollm2_engine, "{\"answer\"")
    partial = smollm2_engine.new_generation([1, 2, 3], _params())
    _take(partial, smollm2_engine, "<th")  # half a tag: only its continuation is allowed
    for token in partial.constraint.allowed().tolist():
        text = smollm2_engine.tokenizer.token_bytes(token)
        assert b"ink>".startswith(text) or text.startswith(b"ink>")


@pytest.mark.slow
def test_a_budget_closes_an_opened_block_then_the_answer_validates(smollm2_engine: Engine) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    engine = Engine(smollm2_engine.model, smollm2_engine.tokenizer,
                    ChatTemplate.from_source(THINKING_TEMPLATE, smollm2_engine.tokenizer))
    assert engine.opens_thinking and engine.thinks and not smollm2_engine.thinks
    prompt = engine.encode_chat([{"role": "user", "content": "Is the sky blue? Answer in JSON."}])
    sched = Scheduler(engine, SchedulerConfig(max_sequences=4, kv_budget_mib=64))
    sched.add(GenerationRequest("r", prompt, _params(thinking_opened=True, thinking_budget=10)))
    text, reason = "", None
    while sched.has_work:
        for event in sched.step():
            assert not isinstance(event, RequestFailed), event.message
            if isinstance(event, SequenceStep):
                text, reason = text + event.output.text, event.output.finish_reason
    thought, answer = text.split("</think>")
    assert len(engine.tokenizer.encode(thought, parse_special=False, add_bos=False)) <= 12, thought
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert reason == "stop"


def test_the_vocabulary_tells_a_reasoning_model() -> None:
    from tests.support.tiny_gguf import MERGES, tiny_vocab
    from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf

    tokens, types, _ = tiny_vocab()
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2", "tokenizer.ggml.merges": MERGES,
                "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}
    plain = tokenizer_from_gguf({**metadata, "tokenizer.ggml.tokens": tokens,
                                 "tokenizer.ggml.token_type": types})
    paired = tokenizer_from_gguf({**metadata, "tokenizer.ggml.tokens": [*tokens, "<think>", "</think>"],
                                  "tokenizer.ggml.token_type": [*types, 4, 4]})
    assert not has_thinking_tokens(plain) and has_thinking_tokens(paired)
