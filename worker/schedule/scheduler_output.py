"""One step's schedule, as vLLM's SchedulerOutput: the sequences a step runs with the tokens each feeds the forward,
the batch entries built from them, and the step's lowest priority (what an arriving request must outrank to stop
it). Scheduler.step schedules one, executes its forward, then updates every sequence from the outputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.forward_batch import BatchEntry, SuspendedForward
from worker.schedule.preemption import rank
from worker.schedule.sequences import ScheduledSequence, SeqState


def output_kind(seq: ScheduledSequence, tokens: list[int]) -> str:
    """What the forward returns for a plan row: pooled states, every row's logits (drafts), or the last."""
    if seq.gen is None:
        return "hidden"
    if seq.state == SeqState.PREFILLING and seq.group.scorer is not None:
        return "all"  # echo + logprobs: every prompt row is scored (worker.schedule.prompt_scoring)
    return "all" if seq.state == SeqState.DECODING and len(tokens) > 1 else "last"


@dataclass(frozen=True)
class SchedulerOutput:
    """What one step runs: each sequence with its new tokens, the forward's batch entries, the lowest rank."""

    plan: list[tuple[ScheduledSequence, list[int]]]
    entries: list[BatchEntry]
    floor: int  # the lowest priority rank among the step's sequences (preemption.rank)
    resume: SuspendedForward | None = None  # a stopped step going on (worker/schedule/suspension.py)

    @classmethod
    def of(cls, plan: list[tuple[ScheduledSequence, list[int]]]) -> SchedulerOutput:
        """The schedule of a non-empty plan: its batch entries, in plan order, and its lowest rank."""
        entries = [BatchEntry(seq.seq_id, np.asarray(tokens, np.int64), seq.computed, output_kind(seq, tokens),
                              seq.group.request.loras) for seq, tokens in plan]
        return cls(plan, entries, min(rank(seq) for seq, _ in plan))

    @property
    def sequences(self) -> list[ScheduledSequence]:
        """The step's sequences, in plan order."""
        return [seq for seq, _ in self.plan]
