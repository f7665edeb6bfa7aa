"""Thinking-aware output constraints: structured output applies to the answer, not the thinking block.

A reasoning model's reply opens with `<think>…</think>` (or starts inside the block when the chat template's
generation prompt ends with `<think>`). A `ThinkingGate` wraps a sequence's grammar matcher (or none, for a
thinking budget alone) and keeps the grammar off until the block closes, as vLLM's reasoning-aware structured
output does: while the reply may still open a block, the tokens that spell `<think>` are allowed beside the
grammar's; inside the block nothing is masked except a token that would close it and carry answer text in the
same token (the grammar must see the answer from its first byte); after `</think>` (and at most
`ANSWER_WHITESPACE_TOKENS` whitespace tokens, which the reasoning splitter drops) the grammar masks every step.
A thinking budget (Anthropic's `budget_tokens`) forces `\\n</think>\\n\\n` once the block has that many tokens.
The gate reads token bytes only, so a resumed stream rebuilds it exactly by replaying its tokens.
"""

from __future__ import annotations

import copy
from functools import cached_property

import numpy as np

from worker.engine.text.constraints import SequenceConstraint
from worker.engine.text.stopping import THINK_CLOSE, THINK_OPEN
from worker.engine.text.tokenizer import Tokenizer

OPEN, CLOSE = THINK_OPEN.encode(), THINK_CLOSE.encode()
FORCED_CLOSE = "\n" + THINK_CLOSE + "\n\n"  # what a spent thinking budget writes
ANSWER_WHITESPACE_TOKENS = 2  # whitespace-only tokens allowed between `</think>` and the constrained answer


class ThinkingVocabulary:
    """One tokenizer's tables for the gate (built on first use, shared by every sequence of an engine)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        eog = tokenizer.eog_token_ids
        own = tokenizer.vocab_size
        # a control token (eos, chat markers) is never text, except a <think> / </think> token itself
        self.token_bytes = [b"" if i >= own or i in eog or (tokenizer.is_special(i) and tokenizer.token_bytes(i)
                                                             not in (OPEN, CLOSE)) else tokenizer.token_bytes(i)
                            for i in range(vocab_size)]

    def _ids(self, keep: object) -> np.ndarray:
        return np.array([i for i, data in enumerate(self.token_bytes) if data and keep(data)],  # type: ignore[operator]
                        dtype=np.int64)  # (K,)

    @cached_property
    def whitespace(self) -> np.ndarray:
        """Ids (K,) of the tokens that are whitespace only."""
        return self._ids(lambda data: not data.strip())

    def openers(self, matched: int) -> np.ndarray:
        """Ids (K,) of the tokens that go on spelling `<think>` after its first `matched` bytes (leading whitespace
        allowed when nothing is matched yet)."""
        return self._openers[matched]

    @cached_property
    def _openers(self) -> list[np.ndarray]:
        tables = []
        for matched in range(len(OPEN)):
            rest = OPEN[matched:]

            def continues(data: bytes, rest: bytes = rest, first: bool = matched == 0) -> bool:
                data = data.lstrip() if first else data
                return bool(data) and (rest.startswith(data) or data.startswith(rest))
            tables.append(self._ids(continues))
        return tables

    def close_crossers(self, matched: int) -> np.ndarray:
        """Ids (K,) of the tokens that, after a thinking text ending in `</think>`'s first `matched` bytes, close the
        block and carry non-whitespace answer bytes in the same token."""
        return self._close_crossers[matched]

    @cached_property
    def _close_crossers(self) -> list[np.ndarray]:
        tables = []
        for matched in range(len(CLOSE)):
            head = CLOSE[:matched]

            def crosses(data: bytes, head: bytes = head) -> bool:
                joined = head + data
                at = joined.find(CLOSE)
                return at >= 0 and bool(joined[at + len(CLOSE):].strip())
            tables.append(self._ids(lambda data, crosses=crosses: b">" in data and crosses(data)))
        return tables

    @cached_property
    def forced_close(self) -> list[int]:
        """The token ids a spent thinking budget writes (`\\n</think>\\n\\n`)."""
        return self.tokenizer.encode(FORCED_CLOSE, parse_special=True, add_bos=False)


def has_thinking_tokens(tokenizer: Tokenizer) -> bool:
    """Whether the vocabulary has a `<think>` token and a `</think>` token (a reasoning model's pair)."""
    texts = {tokenizer.token_text(i) for i in range(tokenizer.vocab_size) if tokenizer.token_bytes(i) in (OPEN, CLOSE)}
    return {THINK_OPEN, THINK_CLOSE} <= texts


def _partial(data: bytes, tag: bytes) -> int:
    """Length of the longest suffix of data that is a proper prefix of tag."""
    for size in range(min(len(tag) - 1, len(data)), 0, -1):
        if data.endswith(tag[:size]):
            return size
    return 0


class ThinkingGate:
    """A sequence's constraint that starts after its thinking block; the interface of SequenceConstraint."""

    def __init__(self, vocabulary: ThinkingVocabulary, inner: SequenceConstraint | None, *, opened: bool,
                 budget: int | None = None) -> None:
        self._vocab = vocabulary
        self._inner = inner  # the answer's grammar (None: a thinking budget alone)
        self.phase = "thinking" if opened else "start"  # start | opening | thinking | closing | answer-start | answer
        self._held = b""  # start/opening: the bytes so far; thinking: the last bytes (a partial `</think>`)
        self._budget = budget
        self._thought = 0  # tokens inside the block so far
        self._forced: list[int] = []  # closing: the forced tokens still to write
        self._spaces = 0  # answer-start: whitespace tokens taken after `</think>`

    def __call__(self, scores: np.ndarray) -> None:
        """Ban, in place, every token of scores (V,) not allowed next (a LogitsProcessor)."""
        phase = self.phase
        if phase == "closing" and not self._forced:
            phase = self.phase = "thinking"
        if phase == "closing":
            keep = scores[self._forced[0]] if np.isfinite(scores[self._forced[0]]) else 0.0
            scores[:] = -np.inf  # (V,)
            scores[self._forced[0]] = keep
        elif phase == "thinking":
            scores[self._vocab.close_crossers(_partial(self._held, CLOSE))] = -np.inf  # (V,)
        elif phase == "opening" and self._inner is not None:
            allowed = self._vocab.openers(len(self._held.lstrip()))  # (K,)
            kept = scores[allowed]  # (K,)
            scores[:] = -np.inf  # (V,)
            scores[allowed] = kept
        elif self._inner is not None:
            extra = {"start": self._vocab.openers(0), "answer-start": self._vocab.whitespace}.get(phase)
            kept = scores[extra] if extra is not None else None  # (K,)
            self._inner(scores)
            if extra is not None and (phase == "start" or self._spaces < ANSWER_WHITESPACE_TOKENS):
                scores[extra] = kept

    def advance(self, token_id: int) -> bool:
        """Consume an accepted token; True once the answer's grammar is complete (nothing may follow)."""
        data = self._vocab.token_bytes[token_id] if token_id < self._vocab.vocab_size else b""
        phase = self.phase
        if phase in ("start", "opening"):
            held = self._held + data
            head = held.lstrip()
            if head.startswith(OPEN):
                self.phase, self._held = "thinking", b""
                return self._think(head[len(OPEN):])
            if head and OPEN.startswith(head) and (phase == "opening" or token_id in self._vocab.openers(0)):
                self.phase, self._held = "opening", held
                return False
            self.phase, self._held = "answer", b""
            return self._answer(token_id)
        if phase in ("thinking", "closing"):
            if phase == "closing" and self._forced:
                self._forced.pop(0)
            return self._think(data)
        if phase == "answer-start" and data and not data.strip():
            self._spaces += 1
            return False
        self.phase = "answer"
        return self._answer(token_id)

    def _think(self, data: bytes) -> bool:
        """Take thinking bytes; the block closes at `</think>` (what follows it in the same token is whitespace)."""
        self._thought += 1
        joined = self._held + data
        at = joined.find(CLOSE)
        if at < 0:
            self._held = joined[-(len(CLOSE) - 1):]
            if self.phase == "thinking" and self._budget is not None and self._thought >= self._budget:
                self.phase, self._forced = "closing", list(self._vocab.forced_close)
            return False
        self.phase, self._held, self._forced = "answer-start", b"", []
        return False

    def _answer(self, token_id: int) -> bool:
        return self._inner.advance(token_id) if self._inner is not None else False

    @property
    def complete(self) -> bool:
        """Whether the answer's grammar is complete (nothing may follow)."""
        return self.phase == "answer" and self._inner is not None and self._inner.complete

    def copy(self) -> ThinkingGate:
        """An independent gate in the same state (a forked choice)."""
        twin = copy.copy(self)
        twin._inner = self._inner.copy() if self._inner is not None else None
        twin._forced = list(self._forced)
        return twin

    def allowed(self) -> np.ndarray:
        """The ids (K,) allowed next (for tests and debugging)."""
        scores = np.zeros(self._vocab.vocab_size, np.float32)  # (V,)
        twin = self.copy()
        twin(scores)
        return np.flatnonzero(np.isfinite(scores))  # (K,)
