"""Wire messages between gateway and workers: jobs, events and cancel notices (version WIRE_VERSION).

Every message is a frozen, keyword-only dataclass with a `version` field; `shared.codec` is the only
place that turns them into bytes and back. Field types are checked by the codec on decode; the
invariants that span fields are checked here, in `__post_init__`, so a decoded message is always whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Literal

WIRE_VERSION = 1

Priority = Literal["low", "normal", "high", "critical"]
PRIORITIES: tuple[str, ...] = ("low", "normal", "high", "critical")
Pooling = Literal["mean", "last"]


class FinishReason(str, Enum):
    """Why one choice ended."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, kw_only=True)
class ChatMessage:
    """One chat turn; the worker renders the model's chat template over a list of these."""

    role: str
    content: str
    name: str | None = None


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Sampler settings of one generate job; defaults mean 'plain sampling at temperature 1'."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0  # 0 = disabled
    repetition_penalty: float = 1.0  # 1 = disabled
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None  # choice i samples with seed + i; the gateway always fills one in
    # Value ranges are not checked here: the wire checks types; the engine's SamplingParams.validate owns
    # the ranges (the worker answers a bad value with a 400 naming the field), the gateway OpenAI's limits.


@dataclass(frozen=True, kw_only=True)
class GenerateJob:
    """A text-generation job (chat or completion, streaming or not); exactly one prompt form is set."""

    kind: ClassVar[str] = "generate"

    id: str
    model: str
    created: float  # unix seconds
    deadline: float  # unix seconds; both sides stop working on the job after it
    priority: Priority = "normal"
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    max_tokens: int | None = None  # None = up to the model's context
    n: int = 1
    sampling: Sampling = field(default_factory=Sampling)
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None  # None = no logprobs; k = the chosen token's plus k top alternatives
    echo: bool = False
    ignore_eos: bool = False
    cache_prompt: bool = True
    stream: bool = False
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        forms = [self.prompt is not None, self.prompt_token_ids is not None, self.messages is not None]
        _require(sum(forms) == 1, "exactly one of prompt, prompt_token_ids, messages must be set")
        _require(self.n >= 1, "n must be >= 1")
        _require(self.max_tokens is None or self.max_tokens >= 0, "max_tokens must be >= 0")
        _require(self.logprobs is None or self.logprobs >= 0, "logprobs must be >= 0")
        _require(not (self.echo and self.messages is not None), "echo is for prompt jobs only")
        _require(self.deadline >= self.created, "deadline must not be before created")

    def describe(self) -> str:
        """A log line naming sizes only, never the prompt itself."""
        if self.messages is not None:
            size = f"messages={len(self.messages)} chars={sum(len(m.content) for m in self.messages)}"
        elif self.prompt is not None:
            size = f"prompt_chars={len(self.prompt)}"
        else:
            size = f"prompt_tokens={len(self.prompt_token_ids or [])}"
        return f"{self.id} generate model={self.model} {size} max_tokens={self.max_tokens} n={self.n}"


@dataclass(frozen=True, kw_only=True)
class EmbedJob:
    """An embeddings job: one vector per input (strings or token-id lists)."""

    kind: ClassVar[str] = "embed"

    id: str
    model: str
    created: float
    deadline: float
    inputs: list[str] | list[list[int]]
    pooling: Pooling = "mean"
    normalize: bool = True
    priority: Priority = "normal"
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        _require(len(self.inputs) >= 1, "inputs must not be empty")
        _require(self.deadline >= self.created, "deadline must not be before created")

    def describe(self) -> str:
        """A log line naming sizes only, never the inputs themselves."""
        return f"{self.id} embed model={self.model} inputs={len(self.inputs)}"


@dataclass(frozen=True, kw_only=True)
class TopLogprob:
    """One alternative token at a position."""

    token_id: int
    token: str  # the token's own text (may be part of a UTF-8 character; see bytes)
    logprob: float
    bytes: list[int] | None = None


@dataclass(frozen=True, kw_only=True)
class TokenLogprob:
    """The chosen token at a position, its logprob and the top alternatives."""

    token_id: int
    token: str
    logprob: float | None  # None only for the first prompt token of an echo
    bytes: list[int] | None = None
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class TokenEvent:
    """New text of one choice: `text` is the delta; logprobs, when asked for, align with token_ids."""

    kind: ClassVar[str] = "token"

    id: str
    seq: int
    index: int = 0
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    echo: bool = False  # True: this is the prompt, echoed before the choice's first generated token
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        _require(self.seq >= 0 and self.index >= 0, "seq and index must be >= 0")
        _require(
            self.logprobs is None or len(self.logprobs) == len(self.token_ids),
            "logprobs must have one entry per token id",
        )


@dataclass(frozen=True, kw_only=True)
class ChoiceEndEvent:
    """One choice finished."""

    kind: ClassVar[str] = "choice_end"

    id: str
    seq: int
    index: int = 0
    finish_reason: FinishReason
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        _require(self.seq >= 0 and self.index >= 0, "seq and index must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token counts of one request (all choices together)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Worker-measured durations in seconds, from the job's `created`."""

    queue_s: float  # created -> admitted into a batch slot
    first_token_s: float  # created -> first token (or embedding) ready
    total_s: float  # created -> terminal event


@dataclass(frozen=True, kw_only=True)
class DoneEvent:
    """Terminal success of a request; embed jobs carry one vector per input here."""

    kind: ClassVar[str] = "done"

    id: str
    seq: int
    usage: Usage
    embeddings: list[list[float]] | None = None
    timing: Timing | None = None
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        _require(self.seq >= 0, "seq must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ErrorEvent:
    """Terminal failure of a request, already in OpenAI terms (see shared.errors)."""

    kind: ClassVar[str] = "error"

    id: str
    seq: int
    status: int
    type: str
    code: str | None = None
    param: str | None = None
    message: str
    retry_after: float | None = None
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        _require(self.seq >= 0, "seq must be >= 0")
        _require(400 <= self.status <= 599, "status must be an HTTP error status")


@dataclass(frozen=True, kw_only=True)
class CancelRequest:
    """Stop working on a request (client gone or deadline passed); sent on the model's cancel channel."""

    kind: ClassVar[str] = "cancel"

    id: str
    model: str
    reason: str
    version: int = WIRE_VERSION


Job = GenerateJob | EmbedJob
Event = TokenEvent | ChoiceEndEvent | DoneEvent | ErrorEvent
TerminalEvent = DoneEvent | ErrorEvent
Message = GenerateJob | EmbedJob | TokenEvent | ChoiceEndEvent | DoneEvent | ErrorEvent | CancelRequest

JOB_TYPES: tuple[type, ...] = (GenerateJob, EmbedJob)
EVENT_TYPES: tuple[type, ...] = (TokenEvent, ChoiceEndEvent, DoneEvent, ErrorEvent)
MESSAGE_TYPES: tuple[type, ...] = (*JOB_TYPES, *EVENT_TYPES, CancelRequest)


def is_terminal(event: Event) -> bool:
    """True for the one event that ends a request (Done or Error)."""
    return isinstance(event, DoneEvent | ErrorEvent)
