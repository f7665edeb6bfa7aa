"""worker.serve.jobs: a chat job for a model without a chat template is a clear 400; a configured template is used."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from shared.errors import NoChatTemplate
from shared.messages import ChatMessage, GenerateJob
from worker.serve.jobs import prompt_ids_of

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"


def _chat_job() -> GenerateJob:
    now = time.time()
    return GenerateJob(id="job-1", model="tiny", created=now, deadline=now + 60,
                       messages=[ChatMessage(role="user", content="hello")])


def test_chat_on_a_model_without_a_template_is_a_400_naming_the_fix(tiny_engine: Any) -> None:
    assert tiny_engine.chat_template is None  # the tiny GGUF, like a base model, has no template
    with pytest.raises(NoChatTemplate) as caught:
        prompt_ids_of(tiny_engine, _chat_job())
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "no_chat_template", "messages")
    assert "'tiny' has no chat template" in error.message and "--chat-template" in error.message


def test_a_configured_template_renders_chat(tmp_path: Path) -> None:
    from tests.support.tiny_gguf import write_tiny_gguf
    from worker.engine.engine import Engine

    engine = Engine.load(write_tiny_gguf(tmp_path / "tiny.gguf"), chat_template=TEMPLATE)
    ids = prompt_ids_of(engine, _chat_job())
    assert engine.tokenizer.decode(ids) == "[user] hello\n>"


def _prompt_job(**fields: Any) -> GenerateJob:
    now = time.time()
    return GenerateJob(id="job-2", model="tiny", created=now, deadline=now + 60, prompt_token_ids=[1, 2, 3], **fields)


def test_a_job_without_max_tokens_gets_the_default_cut_to_the_context(tiny_engine: Any) -> None:
    from worker.serve.jobs import generation_request

    left = tiny_engine.context_length - 3
    assert generation_request(tiny_engine, _prompt_job(), default_max_tokens=5).params.max_tokens == 5
    assert generation_request(tiny_engine, _prompt_job(), default_max_tokens=10**6).params.max_tokens == left
    assert generation_request(tiny_engine, _prompt_job(), default_max_tokens=0).params.max_tokens == left
    assert generation_request(tiny_engine, _prompt_job(max_tokens=7), default_max_tokens=5).params.max_tokens == 7


@pytest.mark.parametrize("prompt_len_over_context", [0, 1, 50])
def test_a_prompt_that_fills_the_context_without_max_tokens_is_a_400(tiny_engine: Any,
                                                                    prompt_len_over_context: int) -> None:
    from shared.errors import ContextLengthExceeded
    from worker.serve.jobs import generation_request

    now = time.time()
    job = GenerateJob(id="job-3", model="tiny", created=now, deadline=now + 60,
                      prompt_token_ids=[1] * (tiny_engine.context_length + prompt_len_over_context))
    for default in (0, 5):  # was a negative max_tokens, then a forward past the context: a 500 "engine error"
        with pytest.raises(ContextLengthExceeded) as caught:
            generation_request(tiny_engine, job, default_max_tokens=default)
        assert (caught.value.status, caught.value.param) == (400, "prompt")


def _text_job(operation: str, **fields: Any) -> Any:
    from shared.messages import TextJob

    now = time.time()
    return TextJob(id="t", model="smollm2", created=now, deadline=now + 60, operation=operation, **fields)


def test_text_jobs_answer_as_llama_server_does(smollm2_engine: Any, smollm2_reference: dict[str, Any]) -> None:
    """Tokenize (plain and special), pieces, detokenize and apply-template against llama.cpp's own answers."""
    from worker.serve.jobs import text_answer

    for case in smollm2_reference["tokenize"]:
        plain = text_answer(smollm2_engine, _text_job("tokenize", content=case["text"], parse_special=False))
        special = text_answer(smollm2_engine, _text_job("tokenize", content=case["text"]))
        assert (plain["tokens"], special["tokens"]) == (case["ids"], case["ids_special"]), case["text"]
        back = text_answer(smollm2_engine, _text_job("detokenize", tokens=case["ids"]))
        assert back["text"] == case["text"]
    pieces = text_answer(smollm2_engine, _text_job("tokenize", content="Hello world", with_pieces=True))["pieces"]
    assert [(p.id, p.piece) for p in pieces] == [(19556, "Hello"), (905, " world")]
    split = text_answer(smollm2_engine, _text_job("tokenize", content="🙂", with_pieces=True))["pieces"]
    assert all(isinstance(p.piece, list) for p in split) and bytes(sum((p.piece for p in split), [])) == "🙂".encode()
    for case in smollm2_reference["chat_template"]:
        messages = [ChatMessage(role=m["role"], content=m["content"]) for m in case["messages"]]
        rendered = text_answer(smollm2_engine, _text_job("apply_template", messages=messages,
                                                         add_generation_prompt=case["add_generation_prompt"]))
        assert rendered["text"] == case["rendered"]


def test_bad_text_jobs_are_400s(tiny_engine: Any) -> None:
    from shared.errors import InvalidRequest
    from worker.serve.jobs import text_answer

    with pytest.raises(InvalidRequest) as caught:
        text_answer(tiny_engine, _text_job("detokenize", tokens=[10**6]))
    assert caught.value.param == "tokens"
    with pytest.raises(NoChatTemplate):
        text_answer(tiny_engine, _text_job("apply_template", messages=[ChatMessage(role="user", content="x")]))


def _embed_job(inputs: list[Any]) -> Any:
    from shared.messages import EmbedJob

    now = time.time()
    return EmbedJob(id="job-e", model="tiny", created=now, deadline=now + 60, inputs=inputs)


def test_embeddings_of_a_generative_model_are_a_400_naming_the_model_and_the_opt_in(tiny_engine: Any) -> None:
    from shared.errors import InvalidRequest
    from worker.serve.jobs import embedding_request

    assert not tiny_engine.embedding_only  # the tiny GGUF is a causal (llama) model
    with pytest.raises(InvalidRequest) as caught:
        embedding_request(tiny_engine, _embed_job(["hello", "world"]))
    error = caught.value
    assert (error.status, error.type, error.code, error.param) == (400, "invalid_request_error", None, "model")
    assert "'tiny' is a generative model" in error.message and "LLMFLEET_CAUSAL_EMBEDDINGS=1" in error.message


def test_the_opt_in_pools_a_generative_model_as_before(tiny_engine: Any) -> None:
    from shared.errors import InvalidRequest
    from worker.serve.jobs import embedding_request

    request = embedding_request(tiny_engine, _embed_job(["hello", "world"]), causal_embeddings=True)
    assert request.inputs == [tiny_engine.encode_prompt("hello"), tiny_engine.encode_prompt("world")]
    with pytest.raises(InvalidRequest) as caught:  # its inputs are still checked
        embedding_request(tiny_engine, _embed_job([[1, 2], []]), causal_embeddings=True)
    assert caught.value.param == "input"


@pytest.mark.parametrize(("choice", "name", "parallel_grammar"), [
    ("named", "get_weather", False), ("required", None, True), ("auto", None, True)])
def test_a_named_tool_is_one_call_whatever_parallel_tool_calls_says(tiny_engine: Any, choice: str,
                                                                    name: str | None, parallel_grammar: bool) -> None:
    """Issue 42: a named tool_choice closes its grammar after one call, even from a job that allows parallel ones."""
    from shared.messages import ToolSpec
    from worker.engine.text.tools import Tool, call_grammar
    from worker.serve.jobs import TOOL_CALL_TAGS, tool_constraint

    tools = [ToolSpec(name="get_weather"), ToolSpec(name="add")]
    now = time.time()
    job = GenerateJob(id="job-4", model="tiny", created=now, deadline=now + 60, tools=tools, tool_choice=choice,
                      tool_name=name, parallel_tool_calls=True,
                      messages=[ChatMessage(role="user", content="hello")])
    offered = [Tool("get_weather"), Tool("add")] if name is None else [Tool("get_weather")]
    mode = "auto" if choice == "auto" else "required"
    assert tool_constraint(tiny_engine, job) == call_grammar(offered, mode, parallel_grammar, TOOL_CALL_TAGS)


def test_a_harmony_chat_job_gets_harmony_grammars_and_final_channel_stops(gpt_oss_engine: Any) -> None:
    """gpt-oss: the tool grammar and structured output hold harmony messages; stop strings see the final channel;
    a thinking budget (a `<think>` device) does not apply; a job's reasoning goes back to the template."""
    from shared.messages import OutputConstraint, ToolCall, ToolSpec
    from worker.engine.text.constraints import Constraint
    from worker.engine.text.harmony import answer_constraint, call_constraint
    from worker.engine.text.tools import Tool
    from worker.serve.jobs import generation_request

    now = time.time()
    call = ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')
    messages = [ChatMessage(role="user", content="Weather in Paris?"),
                ChatMessage(role="assistant", content="", tool_calls=[call], reasoning="Call get_weather."),
                ChatMessage(role="tool", content="sunny", tool_call_id="c1")]
    job = GenerateJob(id="job-h", model="gpt-oss", created=now, deadline=now + 60, messages=messages, max_tokens=8,
                      tools=[ToolSpec(name="get_weather")], tool_choice="required", stop=["STOP"], reasoning=True,
                      thinking_budget=4)
    request = generation_request(gpt_oss_engine, job)
    params = request.params
    assert params.constraint == call_constraint([Tool("get_weather")], "required")
    assert params.harmony and not params.answer_after_thinking and params.thinking_budget is None
    prompt = gpt_oss_engine.tokenizer.decode(request.prompt_ids, skip_special=False)
    assert "<|channel|>analysis<|message|>Call get_weather.<|end|><|start|>assistant to=functions.get_weather" in prompt
    schema = OutputConstraint(kind="json_schema", source='{"type": "object"}', param="response_format")
    structured = generation_request(gpt_oss_engine, GenerateJob(
        id="job-s", model="gpt-oss", created=now, deadline=now + 60, messages=messages[:1], max_tokens=8,
        constraint=schema))
    assert structured.params.constraint == answer_constraint(Constraint("json_schema", '{"type": "object"}'))
    raw = generation_request(gpt_oss_engine, GenerateJob(id="job-r", model="gpt-oss", created=now,
                                                          deadline=now + 60, prompt="Hi", max_tokens=8))
    assert not raw.params.harmony  # a raw prompt is the client's own text
