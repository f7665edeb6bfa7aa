"""Prompt logprobs for `echo` + `logprobs` (OpenAI's legacy completions): each prompt token's logprob under the
tokens before it, and the top alternatives at its position, from the logits of the prompt's own prefill.

The scheduler asks the forward for every row's logits (output "all") while a request's PromptScorer is not
complete; row j of a chunk starting at position p predicts prompt token p + j + 1. The first prompt token has
no logprob (nothing precedes it). Rows are folded in by position, so a prefill redone after a preemption simply
writes the same positions again. Once complete, the scheduler emits one PromptScored event before the request's
first token, and the publisher turns it into the echo TokenEvent of every choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_SCORED_PROMPT_TOKENS = 4096  # echo + logprobs prompts longer than this are refused (400, param logprobs)


@dataclass(frozen=True)
class PromptTokenScore:
    """One prompt token: its id, its logprob given the tokens before it (None for the first), the top (id, logprob)."""

    token_id: int
    logprob: float | None
    top: list[tuple[int, float]]


@dataclass(frozen=True)
class PromptScored:
    """A scheduler event: the prompt's logprobs of a request are complete (sent before its first token)."""

    request_id: str
    n: int  # choices: each gets the echo with these logprobs
    prompt_ids: list[int]
    scores: list[PromptTokenScore]


class PromptScorer:
    """Collects a prompt's logprobs from the logits rows of its prefill chunks."""

    def __init__(self, prompt_ids: list[int], top: int) -> None:
        self.prompt_ids = list(prompt_ids)
        self.top = max(0, top)
        self._logprobs = np.full(len(prompt_ids), np.nan, np.float64)  # (L,) position 0 stays NaN (None)
        self._top_ids = np.zeros((len(prompt_ids), self.top), np.int64)  # (L, K)
        self._top_logprobs = np.zeros((len(prompt_ids), self.top), np.float64)  # (L, K)
        self._missing = set(range(1, len(prompt_ids)))

    @property
    def complete(self) -> bool:
        """True once every prompt token after the first has its logprob."""
        return not self._missing

    def add(self, start: int, logits: np.ndarray) -> None:
        """Fold in the logits rows (T, V) of positions start..start+T-1 (each predicts the token after it)."""
        rows = np.asarray(logits, dtype=np.float32)  # (T, V)
        targets = np.arange(start + 1, start + 1 + rows.shape[0])  # (T,) the prompt position each row predicts
        keep = targets < len(self.prompt_ids)  # (T,) rows past the prompt (a preempted sequence's tokens) are not scored
        rows, targets = rows[keep], targets[keep]  # (T', V), (T',)
        if not len(targets):
            return
        log_total = _log_sum_exp(rows)  # (T',)
        token_ids = np.asarray(self.prompt_ids, np.int64)[targets]  # (T',)
        self._logprobs[targets] = rows[np.arange(len(targets)), token_ids] - log_total
        if self.top:
            best = _top_ids(rows, self.top)  # (T', K) best first, ties by id
            self._top_ids[targets] = best
            self._top_logprobs[targets] = np.take_along_axis(rows, best, axis=1) - log_total[:, None]
        self._missing.difference_update(int(t) for t in targets)

    def event(self, request_id: str, n: int) -> PromptScored:
        """The PromptScored event of a complete scorer."""
        scores = [PromptTokenScore(self.prompt_ids[0], None, [])]
        for position in range(1, len(self.prompt_ids)):
            top = [(int(i), float(lp)) for i, lp in zip(self._top_ids[position], self._top_logprobs[position])]
            scores.append(PromptTokenScore(self.prompt_ids[position], float(self._logprobs[position]), top))
        return PromptScored(request_id, n, self.prompt_ids, scores)


def _log_sum_exp(rows: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) of each row (T, V) -> (T,), summed in float64 as the sampler's log_softmax_top does."""
    peak = rows.max(axis=1)  # (T,)
    total = np.exp(rows - peak[:, None]).sum(axis=1, dtype=np.float64)  # (T,)
    return peak.astype(np.float64) + np.log(total)


def _top_ids(rows: np.ndarray, k: int) -> np.ndarray:
    """The k best token ids of each row (T, V) -> (T, k), best first, ties broken by the lower id."""
    k = min(k, rows.shape[1])
    candidates = np.argpartition(-rows, k - 1, axis=1)[:, :k]  # (T, k) unordered
    kth = np.take_along_axis(rows, candidates, axis=1).min(axis=1)  # (T,) the k-th best value
    best = np.empty((rows.shape[0], k), np.int64)
    for r in range(rows.shape[0]):  # ties with the k-th value: every tied id is a candidate, lowest ids win
        tied = np.flatnonzero(rows[r] >= kth[r])  # (>=k,)
        best[r] = tied[np.lexsort((tied, -rows[r, tied]))][:k]
    return best
