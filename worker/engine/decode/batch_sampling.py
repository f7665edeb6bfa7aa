"""Sampling a whole step at once: one vectorised pass over every row's logits, each row with its own controls.

Rows are independent: a row's token depends only on its logits, its params, its history and its own
generator, never on the other rows of the batch (so a resumed sequence samples the same on any worker).
A single row is sampled by this same code (Sampler.sample calls it with a batch of one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from worker.engine.kernels.draw_kernels import best_ids, cumulative_draws, descending_order, nucleus_draw

LogitsProcessor = Callable[[np.ndarray], None]  # edits one row of processed scores (V,) in place, e.g. a grammar mask
NUCLEUS_PREFIX = 256  # top_p looks for the nucleus among this many best tokens before sorting the whole row


@dataclass(frozen=True)
class SampledToken:
    """The chosen token, with logprobs (of the raw logits) when they were asked for."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # best first


class RowControls(Protocol):
    """The controls of one row that this module reads (sampling.SamplingParams is one)."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def logprobs(self) -> int | None: ...
    @property
    def is_greedy(self) -> bool: ...


class RowSampler(Protocol):
    """One row's sampler as this module uses it (sampling.Sampler is one)."""

    params: RowControls
    vocab_size: int
    bias_ids: np.ndarray  # (NB,)
    bias_values: np.ndarray  # (NB,)

    @property
    def is_plain_greedy(self) -> bool: ...

    def next_uniform(self) -> float: ...


def sample_batch(samplers: Sequence[RowSampler], logits: np.ndarray | Sequence[np.ndarray],
                 context_ids: Sequence[Sequence[int]], generated_ids: Sequence[Sequence[int]],
                 processors: Sequence[LogitsProcessor | None] | None = None) -> list[SampledToken]:
    """One token per row of raw logits (B, V) (or a list of B rows): bias, penalties, processors, then pick."""
    b = len(samplers)
    rows = [np.asarray(row, dtype=np.float32) for row in logits]  # B x (V,)
    if len(rows) != b or any(row.shape != (samplers[0].vocab_size,) for row in rows):
        raise ValueError(f"logits must be {b} rows of the vocabulary size")
    tokens = np.empty(b, np.int64)  # (B,)
    plain = [i for i, s in enumerate(samplers) if s.is_plain_greedy and not (processors and processors[i])]
    for i in plain:  # argmax of the raw row: no copy of the logits at all
        tokens[i] = int(np.argmax(rows[i]))
    rest = [i for i in range(b) if i not in set(plain)]
    if rest:
        scores = np.stack([rows[i] for i in rest])  # (R, V) a copy, processed in place
        _process([samplers[i] for i in rest], scores, [context_ids[i] for i in rest], [generated_ids[i] for i in rest],
                 [processors[i] for i in rest] if processors else None)
        greedy = [j for j, i in enumerate(rest) if samplers[i].params.is_greedy]
        if greedy:
            tokens[[rest[j] for j in greedy]] = np.argmax(scores[greedy], axis=1)  # (G,)
        drawn = [j for j, i in enumerate(rest) if not samplers[i].params.is_greedy]
        if drawn:
            picked = scores if len(drawn) == len(rest) else scores[drawn]  # (S, V)
            tokens[[rest[j] for j in drawn]] = _draw_rows([samplers[rest[j]] for j in drawn], picked)  # (S,)
    results = []
    for i, sampler in enumerate(samplers):
        token = int(tokens[i])
        if sampler.params.logprobs is None:
            results.append(SampledToken(token))
        else:
            logprob, top = log_softmax_top(rows[i], token, sampler.params.logprobs)
            results.append(SampledToken(token, logprob, top))
    return results


def processed_logits(samplers: Sequence[RowSampler], raw: np.ndarray, context_ids: Sequence[Sequence[int]],
                     generated_ids: Sequence[Sequence[int]],
                     processors: Sequence[LogitsProcessor | None] | None = None) -> np.ndarray:
    """A copy of raw logits (B, V) after logit_bias, repetition and presence/frequency penalties, processors."""
    scores = np.array(raw, dtype=np.float32, copy=True)  # (B, V)
    _process(samplers, scores, context_ids, generated_ids, processors)
    return scores


def _process(samplers: Sequence[RowSampler], scores: np.ndarray, context_ids: Sequence[Sequence[int]],
             generated_ids: Sequence[Sequence[int]], processors: Sequence[LogitsProcessor | None] | None) -> None:
    """processed_logits' controls applied to scores (B, V) float32 in place."""
    b, vocab = scores.shape
    biased = [i for i, s in enumerate(samplers) if s.bias_ids.size]
    if biased:
        rows = np.concatenate([np.full(samplers[i].bias_ids.size, i) for i in biased])  # (NB,)
        ids = np.concatenate([samplers[i].bias_ids for i in biased])  # (NB,)
        scores[rows, ids] += np.concatenate([samplers[i].bias_values for i in biased])  # (NB,)
    repeat = [i for i, s in enumerate(samplers) if s.params.repetition_penalty != 1.0]
    if repeat:
        rows, ids = _row_ids(samplers, repeat, [list(context_ids[i]) + list(generated_ids[i]) for i in repeat], vocab)
        seen = np.zeros((b, vocab), dtype=bool)  # (B, V)
        seen[rows, ids] = True
        penalty = np.array([s.params.repetition_penalty for s in samplers], np.float32)[:, None]  # (B, 1)
        penalised = np.where(scores > 0, scores / penalty, scores * penalty)  # (B, V)
        np.copyto(scores, penalised, where=seen)  # (B, V)
    counted = [i for i, s in enumerate(samplers)
               if s.params.presence_penalty != 0.0 or s.params.frequency_penalty != 0.0]
    if counted:
        rows, ids = _row_ids(samplers, counted, [generated_ids[i] for i in counted], vocab)
        counts = np.zeros((b, vocab), np.float32)  # (B, V)
        np.add.at(counts, (rows, ids), 1.0)
        presence = np.array([s.params.presence_penalty for s in samplers], np.float32)[:, None]  # (B, 1)
        frequency = np.array([s.params.frequency_penalty for s in samplers], np.float32)[:, None]  # (B, 1)
        scores -= np.where(counts > 0, presence + frequency * counts, 0.0).astype(np.float32)  # (B, V)
    for i, processor in enumerate(processors or ()):
        if processor is not None:
            processor(scores[i])
    if not np.isfinite(scores.max(axis=1)).all():
        raise ValueError("every token is banned (by logit_bias or the output constraint)")


def _row_ids(samplers: Sequence[RowSampler], rows: list[int], histories: list[Sequence[int]],
             vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, token id) pairs (M,) x2 of the given histories, refusing ids outside the vocabulary."""
    ids = [np.asarray(h, dtype=np.int64).reshape(-1) for h in histories]
    flat = np.concatenate(ids) if ids else np.empty(0, np.int64)  # (M,)
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= vocab):
        raise ValueError(f"token ids must be in [0, {vocab}), got {flat.min()}..{flat.max()}")
    return np.concatenate([np.full(len(t), r) for r, t in zip(rows, ids)]).astype(np.int64), flat  # (M,) x2


def _draw_rows(samplers: Sequence[RowSampler], scores: np.ndarray) -> np.ndarray:
    """Temperature, top_k, top_p, min_p and one draw per row (S, V) from each row's own generator: (S,).

    Rows without top_k or top_p are drawn unranked (no sort), the others from their ranked best tokens;
    which path a row takes depends only on its own params, so a row never depends on the rest of the batch.
    """
    vocab = scores.shape[1]
    ranked = np.array([0 < x.params.top_k < vocab or x.params.top_p < 1.0 for x in samplers])  # (S,)
    tokens = np.empty(len(samplers), np.int64)  # (S,)
    for mask, draw in ((ranked, _draw_ranked), (~ranked, _draw_unranked)):
        if mask.all():  # one kind of row: no copy of the scores
            return draw(samplers, scores)  # (S,)
        if mask.any():
            rows = np.flatnonzero(mask)  # (S',)
            tokens[rows] = draw([samplers[i] for i in rows], scores[rows])  # (S',)
    return tokens


def _draw_ranked(samplers: Sequence[RowSampler], scores: np.ndarray) -> np.ndarray:
    """Draws for rows with top_k or top_p (S, V): among each row's best tokens, best first, ties by id."""
    s, vocab = scores.shape
    temperature = np.array([x.params.temperature for x in samplers], np.float32)[:, None]  # (S, 1)
    scaled = scores / temperature  # (S, V)
    peak = scaled.max(axis=1, keepdims=True)  # (S, 1)
    top_k = np.array([x.params.top_k if 0 < x.params.top_k < vocab else vocab for x in samplers])  # (S,)
    top_p = np.array([x.params.top_p for x in samplers])  # (S,)
    min_p = np.array([x.params.min_p for x in samplers], np.float32)[:, None]  # (S, 1)
    width = int(min(vocab, max(int(top_k.max()) if (top_k < vocab).any() else 0,
                               NUCLEUS_PREFIX if (top_p < 1.0).any() else 0) or vocab))
    # the best `width` tokens of each row (ties by id), then best first
    ids = best_ids(scaled, width) if width < vocab else np.broadcast_to(np.arange(vocab), (s, vocab))  # (S, W)
    values = np.take_along_axis(scaled, ids, axis=1)  # (S, W)
    order = np.lexsort((ids, -values), axis=1)  # (S, W)
    ids, values = np.take_along_axis(ids, order, axis=1), np.take_along_axis(values, order, axis=1)  # (S, W) x2
    weights = np.exp(values - peak)  # (S, W), best = 1
    weights[np.arange(width)[None, :] >= top_k[:, None]] = 0.0  # top_k
    full_total = (np.exp(scaled - peak).sum(axis=1, dtype=np.float64) if (top_k >= vocab).any()
                  else np.zeros(s))  # (S,) the whole vocabulary's weight (needed by rows without top_k)
    kept_total = np.where(top_k < vocab, weights.sum(axis=1, dtype=np.float64), full_total)  # (S,)
    cumulative = np.cumsum(weights, axis=1, dtype=np.float64)  # (S, W)
    nucleus = top_p < 1.0  # (S,)
    overflow = nucleus & (top_k >= vocab) & (cumulative[:, -1] < top_p * kept_total) & (width < vocab)  # (S,)
    before = cumulative - weights  # (S, W) weight of the better tokens
    weights[nucleus[:, None] & (before >= (top_p * kept_total)[:, None])] = 0.0  # top_p: smallest nucleus
    if (min_p > 0).any():
        weights[weights < min_p] = 0.0  # min_p (the best token has weight 1)
    cumulative = np.cumsum(weights, axis=1, dtype=np.float64)  # (S, W)
    draws = np.array([x.next_uniform() for x in samplers])  # (S,)
    targets = draws * cumulative[:, -1]  # (S,)
    chosen = np.minimum((cumulative <= targets[:, None]).sum(axis=1), width - 1)  # (S,)
    tokens = ids[np.arange(s), chosen]  # (S,)
    for row in np.flatnonzero(overflow):  # the nucleus reaches past the candidates: sort the whole row
        tokens[row] = _draw_full_row(samplers[row], scaled[row], peak[row, 0], draws[row])
    return tokens


def _draw_unranked(samplers: Sequence[RowSampler], scores: np.ndarray) -> np.ndarray:
    """Draws for rows without top_k or top_p (S, V): temperature and min_p need no ordering.

    The weights stay in token-id order, so a uniform draw maps to a token without a sort (sorting a
    262k vocabulary cost ~50 ms a row).
    """
    temperature = np.array([x.params.temperature for x in samplers], np.float32)[:, None]  # (S, 1)
    min_p = np.array([x.params.min_p for x in samplers], np.float32)[:, None]  # (S, 1)
    scaled = scores / temperature  # (S, V)
    weights = np.exp(scaled - scaled.max(axis=1, keepdims=True))  # (S, V), best = 1
    if (min_p > 0).any():
        weights[weights < min_p] = 0.0  # min_p (relative to the best token)
    draws = np.array([x.next_uniform() for x in samplers])  # (S,)
    return cumulative_draws(weights, draws)  # (S,) where the float64 running weight passes draw x total


def _draw_full_row(sampler: RowSampler, scaled: np.ndarray, peak: float, draw: float) -> int:
    """The same draw for one row whose nucleus reaches past the prefix, over the whole row sorted (best first,
    ties by id: descending_order, a compiled radix sort)."""
    total = float(np.exp(scaled - peak).sum(dtype=np.float64))  # the whole row's weight
    ids = descending_order(scaled)  # (V,)
    weights = np.exp(scaled[ids] - peak)  # (V,) best first
    return int(ids[nucleus_draw(weights, sampler.params.top_p * total, sampler.params.min_p, draw)])


def log_softmax_top(raw: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-softmax of `token` over raw logits (V,), and the `top` best (id, logprob), best first."""
    peak = float(raw.max())
    log_total = peak + math.log(float(np.exp(raw - np.float32(peak)).sum(dtype=np.float64)))
    alternatives: list[tuple[int, float]] = []
    top = min(top, raw.shape[0])
    if top > 0:
        best = best_ids(raw[None, :], top)[0]  # (k,) the best `top`, ties to the lower id (one compiled pass)
        best = best[np.lexsort((best, -raw[best]))]  # (k,) by logit, ties by id
        alternatives = [(int(i), float(raw[i]) - log_total) for i in best]
    return float(raw[token]) - log_total, alternatives
