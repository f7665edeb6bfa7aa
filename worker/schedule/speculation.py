"""Prompt-lookup speculative decoding for greedy sequences when the batch is small.

At a handful of streams a step is bound by reading the weights, so checking k drafted tokens in one forward
costs about what one token costs. Drafts come from the sequence itself (as llama.cpp's lookup decoding and
vLLM's n-gram speculator do): the tokens that followed the latest earlier occurrence of its last n tokens.
Verification is exact: each drafted position is kept only while it equals the token the sampler picks there
(greedy, after penalties, bias and the output constraint, whose matcher has taken exactly the tokens kept
before that position), so the output is identical to decoding one token at a time.

How many drafts pay depends on the sequence and on the step's width. Narrow steps multiply the weights' 8-bit
block codes (worker/engine/ops.py): SmolLM2's matrices take ~10 ms at 1 row, ~15 at 4 and ~3.5 ms a row beyond
(bench/block_matmul.py), so k drafts pay only when enough of them are kept. Each
sequence estimates the chance p that a draft is kept (kept drafts against first rejections, decayed) and checks
the k that maximises expected tokens per row-cost, E(k) / (B + 1 + k) with E(k) = (1 - p^(k+1)) / (1 - p) and
B = STEP_BASE_ROWS, a served step's fixed cost in rows. On free-running greedy text with loops p is ~0.9
(k = 6); where p falls, k drops to 2, 1, then 0 (a single probe draft every few steps keeps the estimate
alive). Drafts never widen a step past the narrow-step limit, where the cost per row changes.
"""

from __future__ import annotations

from collections.abc import Sequence

NGRAM_SIZES = (3, 2)  # longest match first
STEP_BASE_ROWS = 3.0  # a served step's fixed cost in rows of the narrow matmul (kernel base, attention, publishing)
ACCEPT_DECAY = 0.9  # weight of the past in the kept-draft estimate, per verified step
PROBE_EVERY = 8  # steps without drafts between single-draft probes of a sequence whose estimate said none


def best_draft_count(p: float, max_drafts: int) -> int:
    """The number of drafts (0..max_drafts) maximising expected tokens per row-cost at keep chance p."""
    best, best_rate = 0, 1.0 / (STEP_BASE_ROWS + 1)
    for k in range(1, max_drafts + 1):
        expected = float(k + 1) if p >= 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)
        rate = expected / (STEP_BASE_ROWS + 1 + k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best


class NgramProposer:
    """Drafts for one sequence from the latest earlier occurrence of its last n tokens."""

    def __init__(self) -> None:
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAM_SIZES}  # n-gram -> its end
        self._indexed = 0  # tokens of the history whose n-grams are in the index
        self._kept = 1.0  # decayed count of drafts kept (a prior of one kept, one rejected)
        self._rejected = 1.0  # decayed count of first rejections
        self._idle_steps = 0  # steps since the last draft while the estimate said none

    @property
    def keep_chance(self) -> float:
        """The estimated chance that a draft is kept (given the one before it was)."""
        return self._kept / (self._kept + self._rejected)

    def record(self, kept: int, rejected: bool) -> None:
        """The outcome of one verified step: drafts kept, and whether one was rejected."""
        self._kept = self._kept * ACCEPT_DECAY + kept
        self._rejected = self._rejected * ACCEPT_DECAY + (1 if rejected else 0)

    def draft_count(self, max_drafts: int) -> int:
        """Drafts to check this step: the best count for the estimate, or a lone probe now and then."""
        k = best_draft_count(self.keep_chance, max_drafts)
        if k > 0:
            return k
        self._idle_steps += 1
        if self._idle_steps >= PROBE_EVERY:
            self._idle_steps = 0
            return min(1, max_drafts)
        return 0

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the last n tokens of history the previous time they occurred."""
        self._extend(history)
        for n in NGRAM_SIZES:
            if len(history) <= n:
                continue
            end = self._index[n].get(tuple(history[-n:]))
            if end is not None:
                return list(history[end : end + k])
        return []

    def _extend(self, history: Sequence[int]) -> None:
        """Index the n-grams ending before the last token (the last one must find an EARLIER occurrence)."""
        for end in range(max(self._indexed, 1), len(history)):
            for n in NGRAM_SIZES:
                if end >= n:
                    self._index[n][tuple(history[end - n : end])] = end
        self._indexed = max(self._indexed, len(history))
