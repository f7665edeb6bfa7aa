"""Turning wire jobs into scheduler requests, and engine failures into client-facing errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from shared.errors import ContextLengthExceeded, InvalidRequest, NoChatTemplate
from shared.messages import ChatMessage, EmbedJob, GenerateJob, TextJob, TokenPiece
from shared.tool_call_tags import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.engine import Engine
from worker.engine.errors import ContextLengthError, NoChatTemplateError, TemplateError
from worker.engine.lora import LoraUse
from worker.engine.text.constraints import Constraint, ConstraintError
from worker.engine.text.harmony import answer_constraint, call_constraint
from worker.engine.text.tools import CallTags, Tool, call_grammar
from worker.schedule.prompt_scoring import MAX_SCORED_PROMPT_TOKENS
from worker.schedule.sequences import EmbeddingRequest, GenerationRequest, Priority

TOOL_CALL_TAGS = CallTags(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)  # the wire contract's, handed to the engine on each use


def prompt_ids_of(engine: Engine, job: GenerateJob) -> list[int]:
    """Tokenize a job's prompt form (text, token ids or chat messages); bad input raises InvalidRequest."""
    if job.messages is not None:
        messages = [_chat_message(m) for m in job.messages]
        with _template_errors(job.model):
            return engine.encode_chat(messages, add_generation_prompt=job.add_generation_prompt,
                                      tools=offered_tools(job), template_kwargs=job.template_kwargs,
                                      tool_call_tags=TOOL_CALL_TAGS)
    if job.prompt_token_ids is not None:
        vocab = engine.model.config.vocab_size
        bad = [t for t in job.prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt")
        return list(job.prompt_token_ids)
    return engine.encode_prompt(job.prompt or "")


def _max_tokens(engine: Engine, job: GenerateJob, prompt_tokens: int, default_max_tokens: int, param: str) -> int:
    """The job's max_tokens (or the default, cut to the context left), checked against the context length."""
    max_tokens = job.max_tokens
    if max_tokens is None:  # at least 1: a prompt that fills the context is a 400 below, not a forward past it
        left = max(engine.context_length - prompt_tokens, 1)
        max_tokens = min(default_max_tokens, left) if default_max_tokens > 0 else left
    try:
        engine.check_fits(prompt_tokens, max_tokens)  # the one context-length rule, with OpenAI's wording
    except ContextLengthError as exc:
        raise ContextLengthExceeded(str(exc), param=param) from None
    return max_tokens


def _checked_sampling(engine: Engine, job: GenerateJob) -> SamplingParams:
    """The job's sampling parameters, validated against the vocabulary (a 400 naming the field)."""
    sampling = sampling_params(job)
    try:
        sampling.validate(engine.model.config.vocab_size)
    except ValueError as exc:
        name = str(exc).split(" ", 1)[0]  # validate's messages start with the field's name
        raise InvalidRequest(str(exc), param=name if hasattr(sampling, name) else None) from None
    return sampling


def generation_request(engine: Engine, job: GenerateJob, *, default_max_tokens: int = 0,
                       loras: tuple[LoraUse, ...] = ()) -> GenerationRequest:
    """Build the scheduler request of a generate job, checking it against the model's limits; a job without
    max_tokens gets `default_max_tokens` (0: none), cut to what the context has left. `loras` are the job's
    adapters, already resolved (worker.loras.AdapterSet.resolve). An embedding-only model refuses (a 400)."""
    if engine.embedding_only:
        raise InvalidRequest(f"model {job.model!r} is an embedding model: it serves /v1/embeddings only, not "
                             "completions or chat", param="model")
    prompt_ids = prompt_ids_of(engine, job)
    param = "messages" if job.messages is not None else "prompt"
    if not prompt_ids:
        raise InvalidRequest("the prompt is empty", param=param)
    max_tokens = _max_tokens(engine, job, len(prompt_ids), default_max_tokens, param)
    sampling = _checked_sampling(engine, job)
    harmony = _harmony_chat(engine, job)
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling, stop=tuple(job.stop),
                              ignore_eos=job.ignore_eos, constraint=output_constraint(engine, job),
                              stop_after_thinking=job.reasoning and not harmony,
                              thinking_opened=_thinking_opened(engine, job),
                              answer_after_thinking=job.reasoning and job.messages is not None and engine.thinks
                              and not harmony,
                              thinking_budget=None if harmony else job.thinking_budget, harmony=harmony)
    scored = job.echo and job.logprobs is not None  # the prompt's own logprobs: every prompt row is computed
    if scored and len(prompt_ids) > MAX_SCORED_PROMPT_TOKENS:
        raise InvalidRequest(f"echo with logprobs scores at most {MAX_SCORED_PROMPT_TOKENS} prompt tokens on this "
                             f"server; the prompt has {len(prompt_ids)}", param="logprobs")
    return GenerationRequest(job.id, prompt_ids, params, n=job.n, priority=Priority.parse(job.priority),
                             cache_prompt=job.cache_prompt and not scored,  # no prefix-cache hit skips a row
                             prompt_logprobs=job.logprobs if scored else None, loras=loras)


def _harmony_chat(engine: Engine, job: GenerateJob) -> bool:
    """Whether a job's reply is harmony (gpt-oss): a chat job on a harmony template, whose grammars hold the
    channels and whose stop strings see the final channel only (a thinking budget does not apply)."""
    return job.messages is not None and engine.harmony


def _thinking_opened(engine: Engine, job: GenerateJob) -> bool:
    """Whether a split chat reply starts inside a thinking block: its prompt ends with `<think>` (the template's
    `enable_thinking` switch as the job sets it)."""
    if not job.reasoning or job.messages is None:
        return False
    disabled = job.template_kwargs.get("enable_thinking") is False
    return engine.opens_thinking_disabled if disabled else engine.opens_thinking


def text_answer(engine: Engine, job: TextJob) -> dict[str, Any]:
    """The DoneEvent fields answering a text job (llama.cpp's /tokenize, /detokenize, /apply-template)."""
    tokenizer = engine.tokenizer
    if job.operation == "tokenize":
        ids = tokenizer.encode(job.content or "", parse_special=job.parse_special,
                               add_bos=None if job.add_special else False)
        if not job.with_pieces:
            return {"tokens": ids}
        return {"tokens": ids, "pieces": [TokenPiece(id=i, piece=_piece(tokenizer.token_bytes(i))) for i in ids]}
    if job.operation == "detokenize":
        vocab = engine.model.config.vocab_size
        bad = [t for t in job.tokens or [] if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="tokens")
        return {"text": tokenizer.decode(job.tokens or [], skip_special=False)}
    messages = [_chat_message(m) for m in job.messages or []]
    with _template_errors(job.model):
        return {"text": engine.render_chat(messages, add_generation_prompt=job.add_generation_prompt,
                                           tool_call_tags=TOOL_CALL_TAGS)}


@contextmanager
def _template_errors(model: str) -> Iterator[None]:
    """Chat-template failures as client errors naming `messages`."""
    try:
        yield
    except NoChatTemplateError:
        raise NoChatTemplate(
            f"model {model!r} has no chat template (it is a base model): use /v1/completions, or start "
            "its workers with --chat-template FILE (LLMFLEET_CHAT_TEMPLATE)", param="messages") from None
    except TemplateError as exc:
        raise InvalidRequest(f"the model's chat template refused these messages: {exc}", param="messages") from None


def _piece(data: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not valid UTF-8 on their own (as llama-server answers)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def _chat_message(message: ChatMessage) -> dict[str, Any]:
    """A wire chat message as the chat template reads it."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning is not None:
        out["reasoning"] = message.reasoning
    return out


def offered_tools(job: GenerateJob) -> list[Tool]:
    """The tools the prompt shows: all of them, unless tool_choice is none."""
    if job.tool_choice == "none":
        return []
    return [Tool(t.name, t.description, t.parameters, t.strict) for t in job.tools]


def _compiled(engine: Engine, constraint: Constraint, param: str) -> Constraint:
    """Compile a constraint now (cached); one that does not compile is a 400 naming its field."""
    try:
        engine.compile_constraint(constraint)
    except ConstraintError as exc:
        raise InvalidRequest(f"Invalid value for '{param}': {exc}", param=param) from None
    return constraint


def tool_constraint(engine: Engine, job: GenerateJob) -> Constraint | None:
    """The grammar of a job's tool calls: forced (required, named) or lazy (auto); each tool's schema first
    compiled alone, so a bad one is named. A named tool is one call: the grammar closes after it."""
    tools = offered_tools(job)
    if not tools:
        return None
    for i, tool in enumerate(tools):
        _compiled(engine, Constraint("json_schema", tool.parameters, tool.strict), f"tools[{i}].function.parameters")
    if job.tool_choice == "named":
        tools = [t for t in tools if t.name == job.tool_name]
    mode = "auto" if job.tool_choice == "auto" else "required"
    if _harmony_chat(engine, job):  # one call a turn: `<|call|>` ends it
        return _compiled(engine, call_constraint(tools, mode), "tools")
    parallel = job.parallel_tool_calls and job.tool_choice != "named"
    return _compiled(engine, call_grammar(tools, mode, parallel, TOOL_CALL_TAGS), "tools")


def output_constraint(engine: Engine, job: GenerateJob) -> Constraint | None:
    """The engine's constraint of a job, compiled now: one that does not compile is a 400 naming its field (a
    harmony reply's is its final channel's body)."""
    if job.constraint is None:
        return tool_constraint(engine, job)
    wire = job.constraint
    constraint = _compiled(engine, Constraint(wire.kind, wire.source, wire.strict), wire.param)
    return _compiled(engine, answer_constraint(constraint), wire.param) if _harmony_chat(engine, job) else constraint


def sampling_params(job: GenerateJob) -> SamplingParams:
    """The engine's sampler settings of a job: the wire's Sampling fields (same names) plus logprobs.

    Values are not range-checked here; `SamplingParams.validate` is the one place that does.
    """
    return SamplingParams(**msgspec.structs.asdict(job.sampling), logprobs=job.logprobs)


def embedding_request(engine: Engine, job: EmbedJob, *, causal_embeddings: bool = False) -> EmbeddingRequest:
    """The scheduler request of an embed job: every input tokenized and checked. A generative (causal) model
    refuses (a 400) unless `causal_embeddings` (LLMFLEET_CAUSAL_EMBEDDINGS) lets it pool its hidden states."""
    if not engine.embedding_only and not causal_embeddings:
        raise InvalidRequest(f"model {job.model!r} is a generative model: it serves completions and chat, not "
                             "embeddings. Use an embedding model (e.g. all-minilm-l6-v2), or start this model's "
                             "workers with LLMFLEET_CAUSAL_EMBEDDINGS=1 to serve its pooled hidden states",
                             param="model")
    inputs = []
    for i, item in enumerate(job.inputs):
        ids = engine.encode_prompt(item) if isinstance(item, str) else list(item)
        if not ids:
            raise InvalidRequest(f"input {i} is empty", param="input")
        if len(ids) > engine.context_length:
            raise InvalidRequest(f"input {i} has {len(ids)} tokens, over the context length "
                                 f"{engine.context_length}", param="input")
        if any(not 0 <= t < engine.model.config.vocab_size for t in ids):
            raise InvalidRequest(f"input {i} has a token id outside the vocabulary", param="input")
        inputs.append(ids)
    return EmbeddingRequest(job.id, inputs, pooling=job.pooling, normalize=job.normalize,
                            priority=Priority.parse(job.priority))
