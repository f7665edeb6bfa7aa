"""Sampling: one row of logits -> one token, with a per-sequence seeded generator and the usual controls."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GREEDY_TEMPERATURE = 1e-5  # temperatures below this mean argmax
MAX_LOGPROBS = 20  # OpenAI's cap on top_logprobs
MAX_LOGIT_BIAS = 100.0  # OpenAI's range is [-100, 100]; -100 bans the token outright
MAX_PRESENCE_FREQUENCY = 2.0  # OpenAI's range for presence/frequency penalties is [-2, 2]
NUCLEUS_PREFIX = 256  # top_p looks for the nucleus among this many best tokens before sorting everything
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
        _require(_finite(penalty) and penalty > 0, "repetition_penalty", "a number > 0", penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            bound = MAX_PRESENCE_FREQUENCY
            _require(_finite(value) and -bound <= value <= bound, name, f"in [-{bound:g}, {bound:g}]", value)
        for token, bias in self.logit_bias.items():
            _require(0 <= token < vocab_size, "logit_bias", f"keyed by token ids in [0, {vocab_size})", token)
            _require(
                _finite(bias) and abs(bias) <= MAX_LOGIT_BIAS, "logit_bias", "values in [-100, 100]", bias
            )
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


@dataclass(frozen=True)
class SampledToken:
    """The chosen token, with logprobs (of the raw logits) when they were asked for."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # best first


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
        self._bias_ids = np.array([t for t, _ in bias], dtype=np.int64)  # (NB,)
        self._bias_values = np.array(
            [-np.inf if b <= -MAX_LOGIT_BIAS else b for _, b in bias], np.float32
        )  # (NB,)

    def skip_draws(self, draws: int) -> None:
        """Advance the generator as if `draws` samples had been taken (to resume a sequence elsewhere)."""
        self._rng.bit_generator.advance(draws)
        self.draws += draws

    def sample(
        self, logits: np.ndarray, context_ids: Sequence[int], generated_ids: Sequence[int]
    ) -> SampledToken:
        """Pick the next token from raw logits (V,), given the prompt ids and the ids generated so far."""
        raw = np.asarray(logits, dtype=np.float32)  # (V,)
        if raw.shape != (self.vocab_size,):
            raise ValueError(f"logits must have shape ({self.vocab_size},), got {raw.shape}")
        scores = self.processed_logits(raw, context_ids, generated_ids)  # (V,)
        token = int(np.argmax(scores)) if self.params.is_greedy else self._draw(scores)
        if self.params.logprobs is None:
            return SampledToken(token)
        logprob, top = log_softmax_top(raw, token, self.params.logprobs)
        return SampledToken(token, logprob, top)

    def processed_logits(
        self, raw: np.ndarray, context_ids: Sequence[int], generated_ids: Sequence[int]
    ) -> np.ndarray:
        """A copy of raw logits (V,) after logit_bias, repetition and presence/frequency penalties."""
        params = self.params
        scores = np.array(raw, dtype=np.float32, copy=True)  # (V,)
        if self._bias_ids.size:
            scores[self._bias_ids] += self._bias_values
        if params.repetition_penalty != 1.0:
            seen_mask = np.zeros(self.vocab_size, dtype=bool)  # (V,)
            seen_mask[self._checked(context_ids)] = True
            seen_mask[self._checked(generated_ids)] = True
            seen = np.flatnonzero(seen_mask)  # (S,)
            values = scores[seen]  # (S,)
            penalty = params.repetition_penalty
            scores[seen] = np.where(values > 0, values / penalty, values * penalty)
        if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            generated = self._checked(generated_ids)  # (G,)
            if generated.size:
                ids, counts = np.unique(generated, return_counts=True)  # (U,), (U,)
                scores[ids] -= params.presence_penalty + params.frequency_penalty * counts
        if not np.isfinite(scores.max()):
            raise ValueError("every token is banned by logit_bias")
        return scores

    def _checked(self, token_ids: Sequence[int]) -> np.ndarray:
        """Token ids as an int64 array (N,), refusing any outside the vocabulary (negatives would wrap)."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)  # (N,)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {ids.min()}..{ids.max()}")
        return ids

    def _draw(self, scores: np.ndarray) -> int:
        """Temperature, top_k, top_p, min_p, then one draw from what is left."""
        params = self.params
        vocab = scores.shape[0]
        ids: np.ndarray | None = None  # None: position == token id
        if 0 < params.top_k < vocab:
            ids = np.argpartition(scores, vocab - params.top_k)[vocab - params.top_k :]  # (K,)
            scaled = scores[ids] / np.float32(params.temperature)  # (K,)
        else:
            scaled = scores / np.float32(params.temperature)  # (V,)
        weights = np.exp(scaled - scaled.max())  # (N,) unnormalised, best = 1
        if params.top_p < 1.0:
            keep = nucleus(weights, params.top_p)  # (M,)
            ids, weights = (keep if ids is None else ids[keep]), weights[keep]
        if params.min_p > 0.0:
            keep = np.flatnonzero(weights >= params.min_p * weights.max())  # (M,)
            ids, weights = (keep if ids is None else ids[keep]), weights[keep]
        cumulative = np.cumsum(weights)  # (M,) non-decreasing
        target = self._rng.random() * float(cumulative[-1])
        self.draws += 1
        chosen = min(int(np.searchsorted(cumulative, target, side="right")), weights.shape[0] - 1)
        return chosen if ids is None else int(ids[chosen])


def nucleus(weights: np.ndarray, top_p: float) -> np.ndarray:
    """Positions of the smallest best-first set whose share of the total weight reaches top_p (>= 1 kept)."""
    count = weights.shape[0]
    threshold = top_p * float(weights.sum(dtype=np.float64))
    candidates = np.arange(count)  # (N,)
    prefix = NUCLEUS_PREFIX
    while prefix < count:  # the nucleus is usually small: look among the best few before sorting everything
        best = np.argpartition(weights, count - prefix)[count - prefix :]  # (P,)
        if float(weights[best].sum(dtype=np.float64)) >= threshold:
            candidates = best
            break
        prefix *= 8
    order = candidates[np.argsort(-weights[candidates])]  # (C,) best first
    cumulative = np.cumsum(weights[order], dtype=np.float64)  # (C,)
    kept = min(int(np.searchsorted(cumulative, threshold, side="left")) + 1, order.shape[0])
    return order[:kept]


def log_softmax_top(raw: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-softmax of `token` over raw logits (V,), and the `top` best (id, logprob), best first."""
    peak = float(raw.max())
    log_total = peak + math.log(float(np.exp(raw - np.float32(peak)).sum(dtype=np.float64)))
    alternatives: list[tuple[int, float]] = []
    vocab = raw.shape[0]
    top = min(top, vocab)
    if top > 0:
        kth_value = raw[np.argpartition(raw, vocab - top)[vocab - top]]
        best = np.flatnonzero(raw >= kth_value)  # (>=k,) every token tied with the k-th is a candidate
        best = best[np.lexsort((best, -raw[best]))][:top]  # (k,) by logit, ties by id
        alternatives = [(int(i), float(raw[i]) - log_total) for i in best]
    return float(raw[token]) - log_total, alternatives


def sample_batch(
    samplers: Sequence[Sampler],
    logits: np.ndarray,
    context_ids: Sequence[Sequence[int]],
    generated_ids: Sequence[Sequence[int]],
) -> list[SampledToken]:
    """Sample one token per row of logits (B, V); plain greedy rows share one vectorised argmax."""
    if logits.ndim != 2 or logits.shape[0] != len(samplers):
        raise ValueError(f"logits must have shape ({len(samplers)}, V), got {logits.shape}")
    plain = [i for i, s in enumerate(samplers) if _is_plain_greedy(s.params)]
    argmax = np.argmax(logits[plain], axis=1) if plain else np.empty(0, dtype=np.int64)  # (P,)
    greedy_tokens = dict(zip(plain, argmax.tolist(), strict=True))
    results: list[SampledToken] = []
    for row, sampler in enumerate(samplers):
        if row in greedy_tokens:
            results.append(SampledToken(int(greedy_tokens[row])))
        else:
            results.append(sampler.sample(logits[row], context_ids[row], generated_ids[row]))
    return results


def _is_plain_greedy(params: SamplingParams) -> bool:
    """Greedy with nothing that changes logits and no logprobs: argmax of the raw row."""
    return (
        params.is_greedy
        and not params.logit_bias
        and params.repetition_penalty == 1.0
        and params.presence_penalty == 0.0
        and params.frequency_penalty == 0.0
        and params.logprobs is None
    )
