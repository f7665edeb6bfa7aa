"""One sequence's generation state: sampling, incremental detokenization and stopping, step by step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from worker.engine.decode.batch_sampling import SampledToken
from worker.engine.decode.sampling import Sampler, SamplingParams
from worker.engine.text.constraints import Constraint, SequenceConstraint
from worker.engine.text.stopping import StopReason, StopStringMatcher, check_token_stop
from worker.engine.text.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(frozen=True)
class GenerationParams:
    """What a request asks of generation, beyond its prompt."""

    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    constraint: Constraint | None = None  # what the output must match (JSON schema, grammar, regex)
    stop_after_thinking: bool = False  # stop strings skip a leading <think> block (the reasoning is split off)
    thinking_opened: bool = False  # the prompt ends inside a <think> block: the reply starts in it
    answer_after_thinking: bool = False  # a reasoning model's reply: the constraint starts after </think>
    thinking_budget: int | None = None  # with answer_after_thinking: `</think>` is forced after this many tokens
    harmony: bool = False  # a harmony reply (gpt-oss): stop strings apply to its final channel only


@dataclass(frozen=True)
class TokenOutput:
    """The result of one generation step for one sequence."""

    token_id: int
    text: str  # text released by this step (stop-string candidates are withheld until they cannot match)
    logprob: float | None
    top_logprobs: list[tuple[int, float]]
    finish_reason: str | None  # None while running, else "stop" or "length"
    stop_sequence: str | None = None  # the stop string that ended the sequence, if one did


class GenerationState:
    """Turns a sequence's logits into tokens and text, and decides when it is finished."""

    def __init__(self, prompt_ids: list[int], params: GenerationParams, tokenizer: Tokenizer, vocab_size: int,
                 constraint: SequenceConstraint | None = None) -> None:
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.tokenizer = tokenizer
        self.generated_ids: list[int] = []
        self.sampler = Sampler(params.sampling, vocab_size)
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stop_matcher = StopStringMatcher(params.stop, after_thinking=params.stop_after_thinking,
                                              opened=params.thinking_opened, harmony=params.harmony)
        self.constraint = constraint  # masks each step's scores, advances on every accepted token
        self.finish_reason: str | None = None

    @property
    def seed(self) -> int:
        """The sampler's seed (what a replacement worker would need to resume the same stream)."""
        return int(self.sampler.seed)

    @property
    def all_ids(self) -> list[int]:
        """Prompt then generated token ids."""
        return self.prompt_ids + self.generated_ids

    def sample(self, logits: np.ndarray) -> SampledToken:
        """Pick the next token from logits (V,) alone (within the constraint, if any), without taking it."""
        return self.sampler.sample(logits, self.prompt_ids, self.generated_ids, processor=self.constraint)

    def accept_logits(self, logits: np.ndarray) -> TokenOutput:
        """Sample the next token from logits (V,), detokenize it, and check every stop condition."""
        if self.finish_reason is not None:
            raise RuntimeError("sequence already finished")
        return self.accept(self.sample(logits))

    def accept(self, sampled: SampledToken) -> TokenOutput:
        """Take a token sampled for this sequence (alone or in a batch): advance the constraint, detokenize
        it, check every stop; a token the constraint refuses raises ConstraintError and changes nothing."""
        if self.finish_reason is not None:
            raise RuntimeError("sequence already finished")
        token = int(sampled.token_id)
        complete = self.constraint is not None and self.constraint.advance(token)
        self.generated_ids.append(token)
        reason = check_token_stop(
            token,
            eog_ids=self.tokenizer.eog_token_ids,
            ignore_eos=self.params.ignore_eos,
            generated_count=len(self.generated_ids),
            max_tokens=self.params.max_tokens,
        )
        is_eog = token in self.tokenizer.eog_token_ids and not self.params.ignore_eos
        piece = "" if is_eog else self.detokenizer.push(token)
        text, stopped = self.stop_matcher.push(piece) if piece else ("", False)
        if complete and reason is None:
            reason = StopReason.STOP  # the grammar is complete: no step is spent on an end-of-text token
        if stopped:
            reason = StopReason.STOP
        elif reason is not None:
            text += self._drain()
        self.finish_reason = reason
        return TokenOutput(token, text, sampled.logprob, list(sampled.top_logprobs), reason,
                           self.stop_matcher.matched if stopped else None)

    def replay(self, token_ids: list[int]) -> None:
        """Take tokens that were already emitted elsewhere (a resumed stream): rebuild penalties, detokenizer
        bytes and stop-string holdback silently, and advance a sampled sequence's generator past their draws."""
        taken = 0
        for token in token_ids:
            if self.finish_reason is not None:
                break
            self.accept(SampledToken(int(token)))
            taken += 1
        if not self.sampler.params.is_greedy:
            self.sampler.skip_draws(taken)  # one uniform per sampled token (Sampler.next_uniform)

    def _drain(self) -> str:
        """Release whatever text is still held back when the sequence ends for a reason other than a stop string."""
        tail, stopped = self.stop_matcher.push(self.detokenizer.flush())
        return tail if stopped else tail + self.stop_matcher.flush()

    def finish(self, reason: str) -> str:
        """End the sequence from outside (e.g. cancelled); returns any text still held back."""
        self.finish_reason = reason
        return self._drain()
