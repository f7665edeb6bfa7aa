"""A step stopped for a request that outranks it is kept, not thrown away (issue 42's fair shares).

When a job ranked above a running step arrives, the step stops between layers (Scheduler.execute) so that the
newcomer's prefill runs at once. Redoing the stopped step from its first layer would cost the running tenants up
to a whole step per arrival; instead the step's rows, as they enter the next layer, are held here with the keys and
values its finished layers wrote (its sequences keep their blocks). Its sequences sit out the steps in between, and
once nothing prefilling outranks the held step it goes on from that layer (Model.resume), for every sequence
that still holds the same blocks: one preempted, cancelled or failed meanwhile has given its blocks back (its
`tenure` moved on) and its rows are dropped; rows are independent, so the others' bits do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.forward_batch import SuspendedForward
from worker.schedule.preemption import rank
from worker.schedule.scheduler_output import SchedulerOutput
from worker.schedule.sequences import ScheduledSequence, SeqState


@dataclass(frozen=True)
class SuspendedStep:
    """A stopped step: its schedule, its forward so far, and each sequence's block tenure when it was planned."""

    scheduled: SchedulerOutput
    forward: SuspendedForward
    tenures: dict[int, int]  # seq_id -> ScheduledSequence.tenure


class HeldStep:
    """At most one stopped step, waiting to go on."""

    def __init__(self) -> None:
        self._held: SuspendedStep | None = None

    @property
    def seq_ids(self) -> frozenset[int]:
        """The sequences of the held step (they sit out every other step until it goes on)."""
        return frozenset(self._held.tenures) if self._held else frozenset()

    def hold(self, scheduled: SchedulerOutput, forward: object) -> bool:
        """Keep a stopped step (StepInterrupted.suspended); False when one is already held or the forward kept
        nothing to go on from (the caller then undoes this one)."""
        if self._held is not None or not isinstance(forward, SuspendedForward):
            return False
        self._held = SuspendedStep(scheduled, forward, {seq.seq_id: seq.tenure for seq in scheduled.sequences})
        return True

    def take(self, active: list[ScheduledSequence]) -> SchedulerOutput | None:
        """The held step's remainder once nothing prefilling outside it outranks it (None while something does, or
        when none is held): its surviving sequences, with `resume` set; a held step none survived is dropped."""
        held = self._held
        if held is None:
            return None
        if max((rank(s) for s in active if s.state == SeqState.PREFILLING and s.seq_id not in held.tenures
                and s.fork_from is None), default=held.scheduled.floor) > held.scheduled.floor:
            return None  # (a choice waiting to share a prompt runs no prefill of its own: it cannot hold one back)
        self._held = None
        alive = {seq.seq_id for seq in held.scheduled.sequences
                 if seq.holds_blocks and seq.tenure == held.tenures[seq.seq_id] and seq in active}
        forward = held.forward.keep(alive)
        if not forward.entries:
            return None
        rows = {seq.seq_id: (seq, tokens) for seq, tokens in held.scheduled.plan}
        plan = [rows[entry.seq_id] for entry in forward.entries]  # the forward's order (a LoRA step sorts rows)
        return SchedulerOutput(plan, forward.entries, min(rank(seq) for seq, _ in plan), resume=forward)
