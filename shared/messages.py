"""Wire messages between gateway and workers: jobs, events and cancel notices (version WIRE_VERSION).

Every message is a frozen, keyword-only `msgspec.Struct` tagged by its `kind` field; `shared.codec` is
the only place that turns them into bytes and back. The wire checks TYPES (msgspec does that on decode)
and the few invariants without which a message is not whole (one prompt form, logprobs aligned with
token ids, seq >= 0). Value ranges of sampling parameters are NOT checked here: the engine's
`SamplingParams.validate` owns them (a worker answers out-of-range values with a 400 error event), and
the gateway checks only OpenAI's documented limits.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec

WIRE_VERSION = 1

PriorityName = Literal["low", "normal", "high", "critical"]  # a job's class on the wire (worker/ ranks them)
PRIORITIES_LOW_TO_HIGH: tuple[str, ...] = ("low", "normal", "high", "critical")
PRIORITIES_HIGH_TO_LOW: tuple[str, ...] = PRIORITIES_LOW_TO_HIGH[::-1]  # the order workers read a model's streams in
Pooling = Literal["mean", "last"]
FinishReason = Literal["stop", "length", "cancelled"]  # why one choice ended; one type for engine, wire, gateway
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "cancelled")
ConstraintKind = Literal["json_schema", "grammar", "regex"]
ToolChoice = Literal["none", "auto", "required", "named"]  # named: tool_name must be called
TextOperation = Literal["tokenize", "detokenize", "apply_template"]  # llama.cpp's /tokenize, /detokenize, /apply-template

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
HttpErrorStatus = Annotated[int, msgspec.Meta(ge=400, le=599)]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


class _Part(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A nested part of a message (a plain map on the wire)."""


class _Message(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    """A top-level wire message: a map tagged by `kind`, with a `version` field (see shared.codec)."""


class ToolCall(_Part, kw_only=True):
    """A function call an assistant turn made (chat history)."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ChatMessage(_Part, kw_only=True, omit_defaults=True):
    """One chat turn; the worker renders the model's chat template over a list of these (fields at their default
    are left out of the bytes: an older worker reads a message that does not use a newer field)."""

    role: str
    content: str
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers
    reasoning: str | None = None  # an assistant turn's reasoning, sent back (a harmony template renders it)


class ToolSpec(_Part, kw_only=True):
    """A function the model may call; the worker renders it into the prompt and compiles its schema."""

    name: str
    description: str = ""
    parameters: str = '{"type":"object"}'  # a JSON schema, as JSON text
    strict: bool = True  # an unsupported schema keyword is an error (False: it is ignored)


class Sampling(_Part, kw_only=True):
    """Sampler settings of one generate job; defaults mean 'plain sampling at temperature 1'."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0  # 0 = disabled
    repetition_penalty: float = 1.0  # 1 = disabled
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = {}
    seed: int | None = None  # choice i samples with seed + i; the gateway always fills one in
    # Value ranges are not checked here: the wire checks types; the engine's SamplingParams.validate owns
    # the ranges (the worker answers a bad value with a 400 naming the field), the gateway OpenAI's limits.

class OutputConstraint(_Part, kw_only=True):
    """What a generate job's output must match, enforced token by token; the worker compiles it and answers
    one that does not compile with a 400 naming `param` and carrying the compiler's message."""

    kind: ConstraintKind  # json_schema: `source` is the schema as JSON text; grammar: GBNF or Lark; regex
    source: str
    strict: bool = True  # json_schema: an unsupported keyword is an error (False: it is ignored)
    param: str  # the request field it came from (e.g. "response_format.json_schema.schema")

    def describe(self) -> str:
        """Kind and size, never the text itself."""
        return f"{self.kind}({len(self.source)} chars)"


class LoraRef(_Part, kw_only=True):
    """A LoRA adapter a generate job runs under: its name (as loaded for the job's model) and scale.

    The gateway checks the scale's range and that a live worker has the adapter; the worker resolves the name
    again (an adapter it lacks is a 404 error event naming it)."""

    name: str
    scale: float = 1.0


class GenerateJob(_Message, tag="generate", kw_only=True):
    """A text-generation job (chat or completion, streaming or not); exactly one prompt form is set."""

    kind: ClassVar[str] = "generate"

    id: str
    model: str
    created: float  # unix seconds
    deadline: float  # unix seconds; both sides stop working on the job after it
    priority: PriorityName = "normal"
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    max_tokens: NonNegative | None = None  # None = up to the model's context
    n: Positive = 1
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    stop: list[str] = []
    logprobs: int | None = None  # None = no logprobs; k = the chosen token's plus k top alternatives
    echo: bool = False
    ignore_eos: bool = False
    cache_prompt: bool = True
    stream: bool = False
    constraint: OutputConstraint | None = None  # structured output (response_format, json_schema, grammar, regex)
    tools: list[ToolSpec] = []
    tool_choice: ToolChoice = "auto"  # with tools; "none" leaves them out of the prompt
    tool_name: str | None = None  # the function tool_choice "named" forces
    parallel_tool_calls: bool = True
    loras: list[LoraRef] = []  # adapters applied to every choice (empty: the base model); a resume re-applies them
    reasoning: bool = False  # the gateway splits a leading <think> block off: stop strings and constraint skip it
    template_kwargs: dict[str, Any] = {}  # chat_template_kwargs: extra chat-template variables (enable_thinking)
    thinking_budget: Positive | None = None  # a reasoning reply's thinking block is closed after this many tokens
    trace: str | None = None  # W3C traceparent of the gateway's request span (tracing on; left out of the bytes if None)
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        forms = (self.prompt is not None) + (self.prompt_token_ids is not None) + (self.messages is not None)
        _require(forms == 1, "exactly one of prompt, prompt_token_ids, messages must be set")
        _require(not (self.echo and self.messages is not None), "echo is for prompt jobs only")
        _require(not self.tools or self.messages is not None, "tools are for chat jobs only")
        _require((self.tool_choice == "named") == (self.tool_name is not None), "tool_name goes with tool_choice named")

    def describe(self) -> str:
        """A log line naming sizes only, never the prompt itself."""
        if self.messages is not None:
            size = f"messages={len(self.messages)} chars={sum(len(m.content) for m in self.messages)}"
        elif self.prompt is not None:
            size = f"prompt_chars={len(self.prompt)}"
        else:
            size = f"prompt_tokens={len(self.prompt_token_ids or [])}"
        constraint = f" constraint={self.constraint.describe()}" if self.constraint is not None else ""
        tools = f" tools={len(self.tools)} tool_choice={self.tool_choice}" if self.tools else ""
        loras = f" loras={','.join(f'{r.name}@{r.scale:g}' for r in self.loras)}" if self.loras else ""
        return (f"{self.id} generate model={self.model} {size} max_tokens={self.max_tokens} n={self.n}"
                f"{constraint}{tools}{loras}")


class EmbedJob(_Message, tag="embed", kw_only=True):
    """An embeddings job: one vector per input, all strings or all token-id lists."""

    kind: ClassVar[str] = "embed"

    id: str
    model: str
    created: float
    deadline: float
    inputs: list[str | list[int]]
    pooling: Pooling = "mean"
    normalize: bool = True
    priority: PriorityName = "normal"
    trace: str | None = None  # as GenerateJob's
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        _require(len(self.inputs) >= 1, "inputs must not be empty")
        strings = sum(isinstance(item, str) for item in self.inputs)
        _require(strings in (0, len(self.inputs)), "inputs must be all strings or all token-id lists")

    def describe(self) -> str:
        """A log line naming sizes only, never the inputs themselves."""
        return f"{self.id} embed model={self.model} inputs={len(self.inputs)}"


class TextJob(_Message, tag="text", kw_only=True):
    """A tokenizer job answered at intake, without a batch slot: tokenize `content`, detokenize `tokens`, or
    render `messages` through the chat template."""

    kind: ClassVar[str] = "text"

    id: str
    model: str
    created: float
    deadline: float
    operation: TextOperation
    content: str | None = None  # tokenize
    tokens: list[int] | None = None  # detokenize
    messages: list[ChatMessage] | None = None  # apply_template
    add_special: bool = False  # tokenize: add BOS as the model's prompts get it
    parse_special: bool = True  # tokenize: text such as <|im_start|> becomes its special token
    with_pieces: bool = False  # tokenize: answer each id with its piece
    add_generation_prompt: bool = True  # apply_template
    priority: PriorityName = "normal"
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        given = {"tokenize": self.content, "detokenize": self.tokens, "apply_template": self.messages}
        _require(given[self.operation] is not None, f"{self.operation} needs its input field")

    def describe(self) -> str:
        """A log line naming sizes only, never the text itself."""
        size = len(self.content or "") + len(self.tokens or []) + len(self.messages or [])
        return f"{self.id} {self.operation} model={self.model} size={size}"


class TokenPiece(_Part, kw_only=True):
    """One token of a /tokenize answer: its id and text (its bytes where they are not valid UTF-8 alone)."""

    id: int
    piece: str | list[int]


class TopLogprob(_Part, kw_only=True):
    """One alternative token at a position."""

    token_id: int
    token: str  # the token's own text (may be part of a UTF-8 character; see bytes)
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Part, kw_only=True):
    """The chosen token at a position, its logprob and the top alternatives."""

    token_id: int
    token: str
    logprob: float | None  # None only for the first prompt token of an echo
    bytes: list[int] | None = None
    top: list[TopLogprob] = []


class TokenEvent(_Message, tag="token", kw_only=True):
    """New text of one choice: `text` is the delta; logprobs, when asked for, align with token_ids."""

    kind: ClassVar[str] = "token"

    id: str
    seq: NonNegative
    index: NonNegative = 0
    text: str
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] | None = None
    echo: bool = False  # True: this is the prompt, echoed before the choice's first generated token
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        if self.logprobs is not None:
            _require(len(self.logprobs) == len(self.token_ids), "logprobs must have one entry per token id")


class ChoiceEndEvent(_Message, tag="choice_end", kw_only=True):
    """One choice finished."""

    kind: ClassVar[str] = "choice_end"

    id: str
    seq: NonNegative
    index: NonNegative = 0
    finish_reason: FinishReason
    stop_sequence: str | None = None  # the stop string that ended the choice ('stop' only), else None
    version: int = WIRE_VERSION


class Usage(_Part, kw_only=True):
    """Token counts of one request (all choices together)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class Timing(_Part, kw_only=True):
    """Worker-measured durations in seconds, from the job's `created`."""

    queue_s: float  # created -> admitted into a batch slot
    first_token_s: float  # created -> first token (or embedding) ready
    total_s: float  # created -> terminal event


class DoneEvent(_Message, tag="done", kw_only=True):
    """Terminal success of a request; embed jobs carry one vector per input here."""

    kind: ClassVar[str] = "done"

    id: str
    seq: NonNegative
    usage: Usage
    embeddings: list[list[float]] | None = None
    timing: Timing | None = None
    tokens: list[int] | None = None  # a text job: tokenize
    pieces: list[TokenPiece] | None = None  # a text job: tokenize with_pieces
    text: str | None = None  # a text job: detokenize, apply_template
    version: int = WIRE_VERSION


class ErrorEvent(_Message, tag="error", kw_only=True):
    """Terminal failure of a request, already in OpenAI terms (see shared.errors)."""

    kind: ClassVar[str] = "error"

    id: str
    seq: NonNegative
    status: HttpErrorStatus
    type: str
    code: str | None = None
    param: str | None = None
    message: str
    retry_after: float | None = None
    version: int = WIRE_VERSION


class CancelRequest(_Message, tag="cancel", kw_only=True):
    """Stop working on a request (client gone or deadline passed); sent on the model's cancel channel."""

    kind: ClassVar[str] = "cancel"

    id: str
    model: str
    reason: str
    version: int = WIRE_VERSION


Job = GenerateJob | EmbedJob | TextJob
Event = TokenEvent | ChoiceEndEvent | DoneEvent | ErrorEvent
TerminalEvent = DoneEvent | ErrorEvent
Message = GenerateJob | EmbedJob | TextJob | TokenEvent | ChoiceEndEvent | DoneEvent | ErrorEvent | CancelRequest

JOB_TYPES: tuple[type, ...] = (GenerateJob, EmbedJob, TextJob)
EVENT_TYPES: tuple[type, ...] = (TokenEvent, ChoiceEndEvent, DoneEvent, ErrorEvent)
MESSAGE_TYPES: tuple[type, ...] = (*JOB_TYPES, *EVENT_TYPES, CancelRequest)


def is_terminal(event: Event) -> bool:
    """True for the one event that ends a request (Done or Error)."""
    return type(event) is DoneEvent or type(event) is ErrorEvent
