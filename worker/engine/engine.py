"""A model ready to serve: weights, tokenizer and chat template loaded from one GGUF file."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from worker.engine.decode.generation import GenerationParams, GenerationState
from worker.engine.embeddings import Pooling, embed, encode_batch
from worker.engine.errors import ContextLengthError, NoChatTemplateError, TemplateError
from worker.engine.forward_batch import BatchEntry
from worker.engine.measured_rate import rate_file, remember, remembered
from worker.engine.model import Model
from worker.engine.text.chat_template import RESERVED_TEMPLATE_VARIABLES, ChatTemplate
from worker.engine.text.constraints import Constraint, GrammarCompiler, SequenceConstraint
from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf
from worker.engine.text.harmony import harmony_messages, is_harmony
from worker.engine.text.stopping import THINK_CLOSE, THINK_OPEN
from worker.engine.text.thinking import ThinkingGate, ThinkingVocabulary, has_thinking_tokens
from worker.engine.text.tokenizer import Tokenizer
from worker.engine.text.tools import CallTags, Tool, ToolTemplateSupport, prepare_messages, probe

MEASURED_ROWS = 8  # sequences of the start-up decode step that estimates a full step's rate


class Engine:
    """Everything needed to turn a prompt into tokens for one model file."""

    def __init__(self, model: Model, tokenizer: Tokenizer, chat_template: ChatTemplate | None,
                 source: Path | None = None) -> None:
        self.model = model
        self.source = source  # the GGUF file loaded (None: built in memory)
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.grammars = GrammarCompiler(tokenizer, model.config.vocab_size)  # one llguidance tokenizer per engine
        self._tool_support: dict[CallTags, ToolTemplateSupport] = {}  # probed once per tool-call format

    @classmethod
    def load(cls, path: str | Path, *, chat_template: str | None = None) -> Engine:
        """Load a GGUF file: dequantized weights, tokenizer from its metadata, a chat template.

        `chat_template` (jinja2 source) replaces the file's own; a file without one (a base model) and no
        replacement leaves the engine without chat: encode_chat raises NoChatTemplateError.
        """
        model = Model.from_file(path)
        tokenizer = tokenizer_from_gguf(model.metadata, source=str(path))
        source = chat_template if chat_template is not None else model.metadata.get("tokenizer.chat_template")
        template = (ChatTemplate.from_source(source, tokenizer)
                    if isinstance(source, str) and source.strip() else None)
        return cls(model, tokenizer, template, Path(path))

    @property
    def embedding_only(self) -> bool:
        """Whether the model is an embedding encoder (BERT): it embeds, it cannot generate."""
        return self.model.is_encoder

    @property
    def context_length(self) -> int:
        """Maximum tokens (prompt + completion) of one sequence."""
        return self.model.config.context_length

    def encode_prompt(self, text: str) -> list[int]:
        """Tokenize raw prompt text; special-token text such as <|im_start|> is parsed as special tokens."""
        return self.tokenizer.encode(text, parse_special=True)

    @cached_property
    def opens_thinking(self) -> bool:
        """Whether the chat template's generation prompt ends inside a thinking block (`...<think>`, as newer
        DeepSeek-R1 templates write it): the reply then starts with reasoning, without its own `<think>`."""
        return self.opens_thinking_with(None)

    @cached_property
    def opens_thinking_disabled(self) -> bool:
        """Whether the generation prompt still ends inside a thinking block with `enable_thinking=false` (a
        template that ignores the switch)."""
        return self.opens_thinking_with(False)

    def opens_thinking_with(self, enable_thinking: bool | None) -> bool:
        """Whether the generation prompt ends with `<think>` under this `enable_thinking` (None: not passed)."""
        if self.chat_template is None:
            return False
        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        try:
            prompt = self.chat_template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                               **extra)
        except TemplateError:
            return False
        return prompt.rstrip().endswith(THINK_OPEN)

    @cached_property
    def harmony(self) -> bool:
        """Whether the chat template writes OpenAI's harmony format (gpt-oss: channels, not `<think>` blocks)."""
        return self.chat_template is not None and is_harmony(self.chat_template.source)

    @cached_property
    def thinks(self) -> bool:
        """Whether the model is a reasoning model: its template opens a thinking block or writes one, or its
        vocabulary has a `<think>` / `</think>` token pair (Qwen3, DeepSeek-R1 distills)."""
        source = self.chat_template.source if self.chat_template is not None else ""
        return (self.opens_thinking or THINK_OPEN in source or THINK_CLOSE in source
                or has_thinking_tokens(self.tokenizer))

    @cached_property
    def thinking_vocabulary(self) -> ThinkingVocabulary:
        """The tables of the thinking gate for this tokenizer (built on first use)."""
        return ThinkingVocabulary(self.tokenizer, self.model.config.vocab_size)

    def tool_support(self, tags: CallTags) -> ToolTemplateSupport:
        """What the chat template renders natively in the tool-call format of `tags` (probed on first use)."""
        if tags not in self._tool_support:
            self._tool_support[tags] = (probe(self.chat_template, tags) if self.chat_template is not None
                                        else ToolTemplateSupport(False, False))
        return self._tool_support[tags]

    def encode_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    tools: Sequence[Tool] = (), template_kwargs: Mapping[str, Any] | None = None,
                    tool_call_tags: CallTags | None = None) -> list[int]:
        """Render messages (and tools) through the model's chat template, then tokenize (no extra BOS: the
        template has it)."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                template_kwargs=template_kwargs, tool_call_tags=tool_call_tags)
        return self.tokenizer.encode(text, parse_special=True, add_bos=False)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    tools: Sequence[Tool] = (), template_kwargs: Mapping[str, Any] | None = None,
                    tool_call_tags: CallTags | None = None) -> str:
        """The prompt text of messages (and tools) under the model's chat template; tools and tool-call history
        go natively or as text, as tools.prepare_messages says, in the format of `tool_call_tags` (required with
        either, unless the template is harmony's, which takes them, and an assistant turn's `reasoning`,
        natively; other templates never see `reasoning`). `template_kwargs` are extra template variables (a
        request's chat_template_kwargs, e.g. enable_thinking); they never replace the template's own."""
        if self.chat_template is None:
            raise NoChatTemplateError("the model has no chat template (it is a base model); configure one "
                                      "(--chat-template FILE) or send raw prompts")
        tools_variable = None
        if self.harmony:  # the template renders tools, calls, results and reasoning itself
            messages, tools_variable = harmony_messages(messages), [t.openai() for t in tools] or None
        else:
            messages = [{k: v for k, v in m.items() if k != "reasoning"} for m in messages]
            if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
                if tool_call_tags is None:
                    raise ValueError("tools or tool-call history need the tool-call tags (a worker passes the "
                                     "wire contract's)")
                messages, tools_variable = prepare_messages(messages, tools, self.tool_support(tool_call_tags),
                                                            tool_call_tags)
        extra = {k: v for k, v in (template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_VARIABLES}
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools_variable,
                                         **extra)

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Raise ContextLengthError (OpenAI's wording) unless prompt + max_tokens fits in the context window."""
        if prompt_len + max_tokens > self.context_length:
            raise ContextLengthError(
                f"This model's maximum context length is {self.context_length} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion). "
                "Please reduce the prompt or max_tokens.")

    def compile_constraint(self, constraint: Constraint) -> None:
        """Compile an output constraint now (cached); ConstraintError with the compiler's message if invalid."""
        self.grammars.compile(constraint)

    def new_generation(self, prompt_ids: list[int], params: GenerationParams) -> GenerationState:
        """A fresh generation state for one sequence (with its own matcher when the output is constrained)."""
        constraint: SequenceConstraint | ThinkingGate | None = (
            None if params.constraint is None else self.grammars.new_sequence(params.constraint))
        if params.answer_after_thinking and (constraint is not None or params.thinking_budget is not None):
            constraint = ThinkingGate(self.thinking_vocabulary, constraint, opened=params.thinking_opened,
                                      budget=params.thinking_budget)
        return GenerationState(prompt_ids, params, self.tokenizer, self.model.config.vocab_size, constraint)

    def embed(self, token_ids: list[int], *, pooling: Pooling = "mean", normalize: bool = True) -> np.ndarray:
        """An embedding (D,) of a token sequence (an encoder pools as its file declares, whatever `pooling`)."""
        self.check_fits(len(token_ids), 0)
        if self.embedding_only:
            return encode_batch(self.model, [token_ids], normalize=normalize)[0]  # (D,)
        return embed(self.model, token_ids, pooling=pooling, normalize=normalize)

    def embed_batch(self, inputs: list[list[int]], *, normalize: bool | Sequence[bool] = True) -> np.ndarray:
        """Embeddings (B, D) of many token sequences: one forward for an encoder, one at a time for a causal LM;
        `normalize` for all or one flag per input."""
        for ids in inputs:
            self.check_fits(len(ids), 0)
        if self.embedding_only:
            return encode_batch(self.model, inputs, normalize=normalize)  # (B, D)
        flags = [normalize] * len(inputs) if isinstance(normalize, bool) else list(normalize)
        return np.stack([embed(self.model, ids, normalize=n) for ids, n in zip(inputs, flags, strict=True)])  # (B, D)

    def measure_decode_rate(self, rows: int) -> float:
        """Tokens per second of one decode step over `rows` fresh sequences, estimated (admission's first guess).

        Runs a step of at most MEASURED_ROWS sequences twice on a throw-away pool and times the second, and
        scales its rate to `rows` (contexts are short and a wide step costs more than a narrow one a row, so it
        errs high; admission takes half of it until real rates arrive). Two full steps of a big model took seconds
        of every worker's start, so the first measurement of a model file on a machine is remembered beside its
        repack cache and later starts read it (worker/engine/measured_rate.py).
        """
        wanted = max(1, rows)
        rows = min(wanted, MEASURED_ROWS)
        kept = rate_file(self.source, rows)
        rate = remembered(kept)
        if rate is None:
            rate = self._measure_step_rate(rows)
            remember(kept, rate)
        elif not self.embedding_only:
            self._decode_step(1)  # one narrow step: the compiled kernels are loaded before the first request
        return rate if self.embedding_only else rate * wanted / rows

    def _measure_step_rate(self, rows: int) -> float:
        """Tokens per second of a `rows`-wide decode step (an embedding model: of a batch of `rows` texts)."""
        if self.embedding_only:  # tokens/s of one batch of 16-token texts (an encoder has no decode step)
            texts = [[self.tokenizer.bos_token_id or 0] * 16 for _ in range(rows)]
            self.embed_batch(texts)
            started = time.perf_counter()
            self.embed_batch(texts)
            return 16 * rows / max(time.perf_counter() - started, 1e-6)
        self._decode_step(rows)  # compiled kernels not yet used are loaded here
        return rows / self._decode_step(rows)

    def _decode_step(self, rows: int) -> float:
        """Seconds of one decode step over `rows` one-token sequences on a throw-away pool."""
        pool = self.model.new_pool((rows + 2) * self.model.config.kv_bytes_per_token, block_size=1,
                                   enable_prefix_caching=False)
        for seq_id in range(rows):
            pool.ensure(seq_id, 1)
        entries = [BatchEntry(seq_id, np.array([self.tokenizer.bos_token_id or 0]), 0) for seq_id in range(rows)]
        started = time.perf_counter()
        self.model.forward(entries, pool)
        return max(time.perf_counter() - started, 1e-6)
