"""Sampling: one row of logits -> one token, with a per-sequence seeded generator and the usual controls."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.engine.decode.batch_sampling import LogitsProcessor, SampledToken, processed_logits, sample_batch

GREEDY_TEMPERATURE = 1e-5  # temperatures below this mean argmax
MAX_LOGPROBS = 20  # OpenAI's cap on top_logprobs
MAX_LOGIT_BIAS_MAGNITUDE = 100.0  # one token's |bias|: OpenAI's range is [-100, 100]; -100 bans the token outright
# (how many entries a request may carry is the gateway's rule: gateway/replies/protocol.py MAX_LOGIT_BIAS_ENTRIES)
REPETITION_PENALTY_RANGE = (0.01, 100.0)  # 1 = off; near 0 would divide logits into overflow
MAX_PRESENCE_FREQUENCY = 2.0  # OpenAI's range for presence/frequency penalties is [-2, 2]
SEED_MODULUS = 2**64


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token of one sequence (OpenAI and llama.cpp controls)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # CTRL/llama.cpp style, over prompt + generated tokens
    presence_penalty: float = 0.0  # OpenAI style, over generated tokens
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict, hash=False)  # token id -> bias
    seed: int | None = None  # None: the Sampler draws one and exposes it
    logprobs: int | None = None  # None: no logprobs; k: chosen token's logprob plus k alternatives

    def __post_init__(self) -> None:
        try:  # JSON gives logit_bias keys as strings, or null for none
            bias = {int(token): float(value) for token, value in dict(self.logit_bias or {}).items()}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"logit_bias must map token ids to numbers ({exc})") from None
        object.__setattr__(self, "logit_bias", bias)

    @property
    def is_greedy(self) -> bool:
        """Whether this picks the argmax (temperature 0)."""
        return self.temperature < GREEDY_TEMPERATURE

    def validate(self, vocab_size: int) -> None:
        """Raise ValueError naming the first field that is out of range."""
        _require(
            _finite(self.temperature) and self.temperature >= 0,
            "temperature",
            "a number >= 0",
            self.temperature,
        )
        _require(_is_int(self.top_k) and self.top_k >= 0, "top_k", "an integer >= 0 (0 = off)", self.top_k)
        _require(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _require(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        penalty = self.repetition_penalty
        low, high = REPETITION_PENALTY_RANGE
        _require(_finite(penalty) and low <= penalty <= high, "repetition_penalty", f"in [{low:g}, {high:g}]", penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            bound = MAX_PRESENCE_FREQUENCY
            _require(_finite(value) and -bound <= value <= bound, name, f"in [-{bound:g}, {bound:g}]", value)
        for token, bias in self.logit_bias.items():
            _require(0 <= token < vocab_size, "logit_bias", f"keyed by token ids in [0, {vocab_size})", token)
            bound = MAX_LOGIT_BIAS_MAGNITUDE
            _require(_finite(bias) and abs(bias) <= bound, "logit_bias", f"values in [-{bound:g}, {bound:g}]", bias)
        _require(self.seed is None or _is_int(self.seed), "seed", "an integer or null", self.seed)
        logprobs = self.logprobs
        _require(
            logprobs is None or (_is_int(logprobs) and 0 <= logprobs <= MAX_LOGPROBS),
            "logprobs",
            f"null or an integer in [0, {MAX_LOGPROBS}]",
            logprobs,
        )


def _require(ok: bool, name: str, expected: str, got: Any) -> None:
    """Raise ValueError('<name> must be <expected>, got <got>') unless ok."""
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {got!r}")


def _finite(value: Any) -> bool:
    """A real, finite number (bools excluded)."""
    is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    return is_number and math.isfinite(value)


def _is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Sampler:
    """Picks tokens for one sequence with its own seeded PCG64 generator."""

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        params.validate(vocab_size)
        self.params = params
        self.vocab_size = vocab_size
        self.seed: int = (
            params.seed if params.seed is not None else int(np.random.SeedSequence().entropy) % 2**63
        )
        self._rng = np.random.Generator(np.random.PCG64(self.seed % SEED_MODULUS))
        self.draws = 0  # random numbers used so far: exactly one per non-greedy sample
        bias = sorted(params.logit_bias.items())
        self.bias_ids = np.array([t for t, _ in bias], dtype=np.int64)  # (NB,)
        self.bias_values = np.array(
            [-np.inf if b <= -MAX_LOGIT_BIAS_MAGNITUDE else b for _, b in bias], np.float32
        )  # (NB,)

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits: the pick is the raw argmax."""
        p = self.params
        return (p.is_greedy and not self.bias_ids.size and p.repetition_penalty == 1.0
                and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0)

    def skip_draws(self, draws: int) -> None:
        """Advance the generator as if `draws` samples had been taken (to resume a sequence elsewhere)."""
        self._rng.bit_generator.advance(draws)
        self.draws += draws

    def next_uniform(self) -> float:
        """The next uniform number in [0, 1) of this sequence's generator (one per non-greedy sample)."""
        self.draws += 1
        return float(self._rng.random())

    def sample(
        self, logits: np.ndarray, context_ids: Sequence[int], generated_ids: Sequence[int],
        processor: LogitsProcessor | None = None,
    ) -> SampledToken:
        """Pick the next token from raw logits (V,), given the prompt ids, the ids generated so far and an
        optional processor (e.g. a grammar mask)."""
        raw = np.asarray(logits, dtype=np.float32)  # (V,)
        if raw.shape != (self.vocab_size,):
            raise ValueError(f"logits must have shape ({self.vocab_size},), got {raw.shape}")
        return sample_batch([self], [raw], [context_ids], [generated_ids], [processor])[0]

    def processed_logits(
        self, raw: np.ndarray, context_ids: Sequence[int], generated_ids: Sequence[int]
    ) -> np.ndarray:
        """A copy of raw logits (V,) after logit_bias, repetition and presence/frequency penalties."""
        row = np.asarray(raw, dtype=np.float32)[None, :]  # (1, V)
        return processed_logits([self], row, [context_ids], [generated_ids])[0]  # (V,)
