"""The scheduler's vocabulary: priorities, sequence states, requests, per-step events and stats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import Enum, IntEnum
from typing import Any

import numpy as np

from worker.engine.decode.generation import GenerationParams, GenerationState, TokenOutput
from worker.engine.lora import LoraUse
from worker.engine.text.stopping import StopReason
from worker.schedule.prompt_scoring import PromptScorer
from worker.schedule.speculation import NgramProposer


class Priority(IntEnum):
    """Admission priority: higher is admitted first."""

    LOW = 0
    NORMAL = 1
    HIGH = 2
    CRITICAL = 3

    @classmethod
    def parse(cls, name: str | int | None) -> Priority:
        """'low' / 'normal' / 'high' / 'critical' (or the int) to a Priority; None means normal."""
        if name is None:
            return cls.NORMAL
        if isinstance(name, int):
            return cls(name)
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown priority {name!r}; expected low, normal, high or critical") from None


class SeqState(str, Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"


@dataclass
class GenerationRequest:
    """What a caller submits: one prompt, n completions of it."""

    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    n: int = 1
    priority: Priority = Priority.NORMAL
    newcomer: bool = False  # a fair-share newcomer: ranks between its class and the one above (preemption.job_rank)
    tenant: str = ""  # whose fair share it counts against (a newcomer's rank is kept below an equal share)
    cache_prompt: bool = True
    resume_tokens: list[list[int]] | None = None  # per choice, tokens a previous worker already sent
    resume_ended: set[int] = field(default_factory=set)  # choices that previous worker already ended
    prompt_logprobs: int | None = None  # echo + logprobs: score the prompt's tokens (top k) before the first token
    loras: tuple[LoraUse, ...] = ()  # LoRA adapters (and scales) every choice runs under

    def choice_params(self, index: int) -> GenerationParams:
        """Choice i of a seeded request samples with seed + i, so choices differ yet stay reproducible."""
        sampling = self.params.sampling
        if index == 0 or sampling.seed is None:
            return self.params
        return replace(self.params, sampling=replace(sampling, seed=sampling.seed + index))



@dataclass
class EmbeddingRequest:
    """Embed each input (token ids): a prefill-only request; no KV is kept after it ends."""

    request_id: str
    inputs: list[list[int]]
    pooling: str = "mean"  # "mean" or "last"
    normalize: bool = True
    priority: Priority = Priority.NORMAL
    newcomer: bool = False  # as GenerationRequest's (embeddings never are: one short forward each)
    tenant: str = ""
    n: int = 1  # sequences are the inputs, none forked
    cache_prompt: bool = False
    loras: tuple[LoraUse, ...] = ()  # embeddings run on the base model

    @property
    def prompt_ids(self) -> list[int]:
        """Every input's tokens (for counting)."""
        return [t for ids in self.inputs for t in ids]


@dataclass
class RequestTimings:
    """Monotonic timestamps of one request's life, and the durations derived from them."""

    arrived: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None

    @property
    def queue_s(self) -> float | None:
        """Seconds spent waiting before admission."""
        return None if self.admitted is None else self.admitted - self.arrived

    @property
    def ttft_s(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token is None else self.first_token - self.arrived

    @property
    def decode_s(self) -> float | None:
        """Seconds from the first token to the end."""
        if self.first_token is None or self.finished is None:
            return None
        return self.finished - self.first_token


class ScheduledSequence:
    """One choice of a request: its generation state, its blocks in the KV pool and its scheduling state."""

    def __init__(self, group: RequestGroup, index: int, state: GenerationState | None, seq_id: int,
                 embed_ids: list[int] | None = None) -> None:
        self.group = group
        self.index = index
        self.gen = state  # None for an embedding input
        self.embed_ids = embed_ids  # the input of an embedding sequence
        self.pooled: np.ndarray | None = None  # (D,) running sum (mean) or last hidden state of an embedding
        self.seq_id = seq_id  # its block table's id in the engine's KV pool
        self.state = SeqState.WAITING
        self.holds_blocks = False  # has a block table in the KV pool
        self.tenure = 0  # times it gave its blocks back: a step planned before then no longer applies to it
        self.computed = 0  # tokens whose KV is in the pool
        self.admit_order = -1
        self.fork_from: ScheduledSequence | None = None  # set while waiting to share the leader's prompt blocks
        self.was_preempted = False
        self.proposer: NgramProposer | None = None  # speculative drafts of a greedy sequence

    @property
    def target_ids(self) -> list[int]:
        """Tokens that must be in the cache before the next token is sampled (or the embedding is ready)."""
        return self.embed_ids if self.gen is None else self.gen.all_ids

    @property
    def pending_prefill(self) -> int:
        """Tokens still to prefill before sampling."""
        if not self.holds_blocks:
            return 0
        if self.gen is None:
            return len(self.embed_ids) - self.computed
        return len(self.gen.prompt_ids) + len(self.gen.generated_ids) - self.computed

    def draft_tokens(self, max_drafts: int, budget: int, context_length: int) -> list[int]:
        """Tokens to check after a greedy decoding sequence's last one this step (none for sampled sequences)."""
        gen = self.gen
        if gen is None or not gen.sampler.params.is_greedy:
            return []
        room = min(max_drafts, gen.params.max_tokens - len(gen.generated_ids) - 1, budget - 1,
                   context_length - self.computed - 1)
        if room <= 0:
            return []
        if self.proposer is None:
            self.proposer = NgramProposer()
        count = self.proposer.draft_count(room)
        return self.proposer.propose(gen.all_ids, count) if count > 0 else []


class RequestGroup:
    """A submitted request and its n sequences."""

    def __init__(self, request: GenerationRequest | EmbeddingRequest, arrival: int) -> None:
        self.request = request
        self.arrival = arrival
        self.sequences: list[ScheduledSequence] = []
        self.timings = RequestTimings()
        self.cached_tokens = 0
        self.cancelled = False
        self.scorer: PromptScorer | None = None  # collects the prompt's logprobs until they are sent

    @property
    def tokens_left(self) -> int:
        """Tokens this request may still generate (max_tokens per choice, minus what was generated); 0 for an
        embedding. The gateways' admission weighs the work ahead with it."""
        if isinstance(self.request, EmbeddingRequest):
            return 0
        limit = self.request.params.max_tokens
        return sum(max(0, limit - len(s.gen.generated_ids)) for s in self.sequences
                   if s.gen is not None and s.state not in (SeqState.FINISHED, SeqState.CANCELLED))

    @property
    def done(self) -> bool:
        """True when every sequence has finished or was cancelled."""
        return all(s.state in (SeqState.FINISHED, SeqState.CANCELLED) for s in self.sequences)

    def score_chunk(self, start: int, logits: np.ndarray, events: list[Any]) -> np.ndarray:
        """Fold a prefill chunk's rows (T, V) from position `start` into the prompt logprobs; append the
        PromptScored event once complete. Returns the last row (V,), the one the first token is sampled from."""
        scorer = self.scorer
        if scorer is not None:
            scorer.add(start, logits)
            if scorer.complete:
                events.append(scorer.event(self.request.request_id, self.request.n))
                self.scorer = None
        return logits[-1]  # (V,)

    def done_event(self, tails: list[str]) -> RequestDone:
        """The terminal record of a generation request (`tails`: text each choice released at a cancel)."""
        return RequestDone(
            request_id=self.request.request_id,
            finish_reasons=[s.gen.finish_reason or StopReason.CANCELLED for s in self.sequences],
            prompt_tokens=len(self.request.prompt_ids),
            completion_tokens=sum(len(s.gen.generated_ids) for s in self.sequences),
            cached_tokens=self.cached_tokens,
            timings=self.timings,
            seeds=[s.gen.seed for s in self.sequences],
            tail_texts=tails,
        )


@dataclass(frozen=True)
class SequenceStep:
    """One token (and the text it released) for one choice of one request."""

    request_id: str
    index: int
    output: TokenOutput


@dataclass(frozen=True)
class RequestDone:
    """A request ended: per-choice finish reasons, token counts and timings."""

    request_id: str
    finish_reasons: list[str]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: RequestTimings
    seeds: list[int]
    tail_texts: list[str] = field(default_factory=list)  # text released at the very end (cancel), per choice
    unsampled: bool = False  # the choices ended without a token (a scored prompt with max_tokens 0): end each


@dataclass(frozen=True)
class EmbeddingDone:
    """An embedding request ended: one vector per input, in order."""

    request_id: str
    embeddings: list[list[float]]
    prompt_tokens: int
    timings: RequestTimings


@dataclass(frozen=True)
class RequestFailed:
    """A request could not be completed; message is safe to show the client."""

    request_id: str
    message: str
    code: str = "engine_error"


@dataclass
class SchedulerStats:
    """Counters and gauges of one scheduler."""

    requests_received: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    interrupted_steps: int = 0  # steps stopped between layers for a job that outranks them
    preemptions: int = 0
    queue_depth: int = 0
    active: int = 0
    kv_bytes: int = 0
    kv_peak_bytes: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefix_tokens_hit: int = 0
    speculated_tokens: int = 0  # drafted tokens checked
    accepted_tokens: int = 0  # of which kept
    tokens_left: int = 0  # tokens the unfinished requests may still generate (gauge)
