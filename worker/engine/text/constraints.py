"""Output constraints (JSON schemas, grammars, regexes) enforced token by token with llguidance.

One `GrammarCompiler` per engine holds the llguidance tokenizer built from our tokenizer's per-token bytes
and a small cache of compiled grammars. Each constrained sequence holds its own `SequenceConstraint` (an
llguidance matcher, copied from the compiled one): it is the sequence's logits processor (it bans every
token the grammar does not allow next) and it advances on every token the sequence accepts.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import llguidance as llg
import numpy as np

from worker.engine.text.tokenizer import Tokenizer

ConstraintKind = Literal["json_schema", "grammar", "lark", "regex", "llguidance"]
# Whitespace between JSON tokens, bounded as llama.cpp bounds it: nothing, one space, or one or two newlines
# and an indent of at most 20 spaces or tabs; a small model cannot loop on whitespace.
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"
# Numbers a schema leaves unbounded get bounds, as llama.cpp's grammars bound digits, so a small model cannot
# loop on digits either: magnitude below 10^15 (16 digits) and at most 9 decimals (see narrow_schema).
NUMBER_BOUND = 10**15
NUMBER_STEP = 1e-9
_DATA_KEYWORDS = frozenset(("enum", "const", "default", "examples"))  # values, not subschemas
MAX_CACHED_GRAMMARS = 64
# Each byte of a mask word as 8 additive penalties: 0 for an allowed token, -inf for a banned one.
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")  # (256, 8)
_BYTE_PENALTY = np.where(_BYTE_BITS == 1, 0.0, -np.inf).astype(np.float32)  # (256, 8)


class ConstraintError(ValueError):
    """A constraint that does not compile (the message is the compiler's), or a matcher that failed."""


@dataclass(frozen=True)
class Constraint:
    """What one request's output must match."""

    kind: ConstraintKind  # grammar: GBNF or Lark (told apart by llguidance); lark: Lark only; llguidance: a
    # top-level grammar as JSON (several grammars referring to each other, e.g. worker/engine/text/harmony.py's)
    source: str  # the JSON schema as JSON text, or the grammar or regex text
    strict: bool = True  # JSON schemas: an unsupported keyword is an error (False: it is ignored)


def narrow_schema(schema: Any) -> Any:
    """A copy of a JSON schema narrowed as llama.cpp's grammars narrow it (every output still validates against
    the original): numbers and integers without bounds get NUMBER_BOUND (numbers NUMBER_STEP as multipleOf),
    and objects that list properties but say nothing of others get none (not under allOf, whose branches
    combine properties)."""
    root = copy.deepcopy(schema)
    nodes: list[dict[str, Any]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            nodes.append(node)
            stack.extend(value for key, value in node.items() if key not in _DATA_KEYWORDS)
    combines = any("allOf" in node for node in nodes)
    for node in nodes:
        kinds = node.get("type")
        kinds = {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, list) else set()
        if kinds & {"number", "integer"}:
            low, high = node.get("minimum"), node.get("maximum")
            if not _is_number(high) and not (_is_number(low) and low >= NUMBER_BOUND):
                node["maximum"] = NUMBER_BOUND
            if not _is_number(low) and not (_is_number(high) and high <= -NUMBER_BOUND):
                node["minimum"] = -NUMBER_BOUND
            if "number" in kinds and "multipleOf" not in node:
                node["multipleOf"] = NUMBER_STEP
        if (isinstance(node.get("properties"), dict) and not combines
                and "additionalProperties" not in node and "patternProperties" not in node):
            node["additionalProperties"] = False
    return root


def _is_number(value: Any) -> bool:
    """A JSON number (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def grammar_of(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint; ConstraintError with the converter's message if it is malformed."""
    try:
        if constraint.kind == "json_schema":
            options = {"whitespace_pattern": JSON_WHITESPACE, "lenient": not constraint.strict}
            schema = narrow_schema(json.loads(constraint.source))
            return llg.LLMatcher.grammar_from_json_schema(schema, overrides=options)
        if constraint.kind == "grammar":
            return llg.grammar_from("grammar", constraint.source)
        if constraint.kind == "lark":
            return llg.LLMatcher.grammar_from_lark(constraint.source)
        if constraint.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(constraint.source)
        if constraint.kind == "llguidance":
            return constraint.source
    except ValueError as exc:
        raise ConstraintError(str(exc)) from None
    raise ConstraintError(f"unknown constraint kind {constraint.kind!r}")


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads: per-token bytes, special ids, bos/eos, and an encoder."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        own = tokenizer.vocab_size
        self.tokens = [tokenizer.token_bytes(i) if i < own else b"" for i in range(vocab_size)]
        self.special_token_ids = [i for i in range(own) if tokenizer.is_special(i)]
        eog = sorted(tokenizer.eog_token_ids)
        self.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else (eog or [0])[0]
        self.bos_token_id = tokenizer.bos_token_id
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        """Token ids of text (special-token text is read as plain text)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, parse_special=False, add_bos=False)


class SequenceConstraint:
    """One sequence's matcher: masks each step's scores and advances on every accepted token."""

    def __init__(self, matcher: llg.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._mask = np.zeros((vocab_size + 31) // 32, np.int32)  # (W,) one bit per token
        self._penalty = np.empty((self._mask.size * 4, 8), np.float32)  # (W*4, 8) 0 or -inf per token

    def __call__(self, scores: np.ndarray) -> None:
        """Ban, in place, every token of scores (V,) the grammar does not allow next (a LogitsProcessor)."""
        self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        self._check()
        np.take(_BYTE_PENALTY, self._mask.view(np.uint8), axis=0, out=self._penalty)  # (W*4, 8)
        scores += self._penalty.reshape(-1)[: self._vocab_size]  # (V,)

    def allowed(self) -> np.ndarray:
        """The ids (K,) the grammar allows next (for tests and debugging)."""
        self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        bits = np.unpackbits(self._mask.view(np.uint8), bitorder="little", count=self._vocab_size)  # (V,)
        return np.flatnonzero(bits)  # (K,)

    def advance(self, token_id: int) -> bool:
        """Consume an accepted token; True once the grammar is complete (nothing may follow)."""
        if not self._matcher.consume_token(int(token_id)):
            self._check()
            raise ConstraintError(f"the output constraint refused token {token_id}")
        return self._matcher.is_stopped()

    @property
    def complete(self) -> bool:
        """Whether the grammar is complete (nothing may follow)."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """Whether the output may end here (an end-of-generation token is allowed next)."""
        return bool(self._matcher.is_accepting())

    def copy(self) -> SequenceConstraint:
        """An independent matcher in the same state (a forked choice)."""
        return SequenceConstraint(self._matcher.deep_copy(), self._vocab_size)

    def _check(self) -> None:
        """Raise ConstraintError if the matcher is in its error state (it never leaves it)."""
        if self._matcher.is_error():
            raise ConstraintError(f"the output constraint failed: {self._matcher.get_error()}")


class GrammarCompiler:
    """One per engine: the llguidance tokenizer of its vocabulary and the compiled grammars it has seen."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer: llg.LLTokenizer | None = None
        self._compiled: OrderedDict[Constraint, llg.LLMatcher] = OrderedDict()

    @property
    def ll_tokenizer(self) -> llg.LLTokenizer:
        """llguidance's tokenizer over our per-token bytes, built on first use (~0.1 s for 49k tokens)."""
        if self._ll_tokenizer is None:
            vocabulary = _Vocabulary(self._tokenizer, self.vocab_size)
            eos = sorted(self._tokenizer.eog_token_ids) or [vocabulary.eos_token_id]
            self._ll_tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(vocabulary), n_vocab=self.vocab_size,
                                                 eos_token=eos)
        return self._ll_tokenizer

    def compile(self, constraint: Constraint) -> None:
        """Compile a constraint (cached); ConstraintError with the compiler's message if it is invalid."""
        self._template(constraint)

    def new_sequence(self, constraint: Constraint) -> SequenceConstraint:
        """A fresh matcher for one sequence, copied from the compiled grammar."""
        return SequenceConstraint(self._template(constraint).deep_copy(), self.vocab_size)

    def _template(self, constraint: Constraint) -> llg.LLMatcher:
        """The compiled matcher in its initial state (never advanced: sequences get copies)."""
        matcher = self._compiled.get(constraint)
        if matcher is not None:
            self._compiled.move_to_end(constraint)
            return matcher
        grammar = grammar_of(constraint)
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if failed:
            raise ConstraintError(messages[0] if messages else "the grammar is invalid")
        matcher = llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ConstraintError(matcher.get_error())
        self._compiled[constraint] = matcher
        if len(self._compiled) > MAX_CACHED_GRAMMARS:
            self._compiled.popitem(last=False)
        return matcher
