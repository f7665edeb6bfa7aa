"""Prompt-lookup speculative decoding for greedy sequences when the batch is small.

At a handful of streams a step is bound by reading the weights, so checking k drafted tokens in one forward
costs about what one token costs. Drafts come from the sequence itself (as llama.cpp's lookup decoding and
vLLM's n-gram speculator do): the tokens that followed the latest earlier occurrence of its last n tokens.
Verification is exact: each drafted position is kept only while it equals the token the sampler picks there
(greedy, after penalties, bias and the output constraint, whose matcher has taken exactly the tokens kept
before that position), so the output is identical to decoding one token at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.sequences import ScheduledSequence

NGRAM_SIZES = (3, 2)  # longest match first


class NgramProposer:
    """Drafts for one sequence from the latest earlier occurrence of its last n tokens."""

    def __init__(self) -> None:
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAM_SIZES}  # n-gram -> its end
        self._indexed = 0  # tokens of the history whose n-grams are in the index

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


def draft_tokens(seq: ScheduledSequence, max_drafts: int, budget: int, context_length: int) -> list[int]:
    """Tokens to check after a greedy decoding sequence's last one this step (none for sampled sequences)."""
    gen = seq.gen
    if gen is None or not gen.sampler.params.is_greedy:
        return []
    room = min(max_drafts, gen.params.max_tokens - len(gen.generated_ids) - 1, budget - 1,
               context_length - seq.computed - 1)
    if room <= 0:
        return []
    if seq.proposer is None:
        seq.proposer = NgramProposer()
    return seq.proposer.propose(gen.all_ids, room)
