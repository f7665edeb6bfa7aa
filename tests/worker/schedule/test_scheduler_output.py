"""The step's three phases: schedule() returns what one step runs (a SchedulerOutput: its plan, the forward's entries
in plan order, its lowest rank) or None when idle, and driving schedule / execute / update by hand is step()."""

from __future__ import annotations

from typing import Any

from tests.worker.schedule.test_scheduler import _prompt, _request
from worker.schedule.preemption import job_rank, rank
from worker.schedule.scheduler import Scheduler, SchedulerConfig, StepEvent
from worker.schedule.sequences import Priority, SequenceStep


def _by_hand(sched: Scheduler) -> list[StepEvent]:
    events: list[StepEvent] = []
    scheduled = sched.schedule()
    if scheduled is not None and (outputs := sched.execute(scheduled, None, events)) is not None:
        sched.update(scheduled, outputs, events)
    return events


def test_an_idle_scheduler_schedules_nothing(tiny_engine: Any) -> None:
    assert Scheduler(tiny_engine, SchedulerConfig(prefix_cache=False)).schedule() is None


def test_the_output_holds_the_plan_its_entries_and_its_lowest_rank(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig(prefix_cache=False, max_prefill_tokens=8))
    sched.add(_request("first", _prompt(tiny_engine, 20, 1)))
    sched.add(_request("second", _prompt(tiny_engine, 5, 2)))
    scheduled = sched.schedule()
    assert scheduled is not None and len(scheduled.plan) == 2
    assert [e.seq_id for e in scheduled.entries] == [seq.seq_id for seq in scheduled.sequences]
    assert [list(e.tokens) for e in scheduled.entries] == [tokens for _, tokens in scheduled.plan]
    assert [len(tokens) for _, tokens in scheduled.plan] == [8, 5]  # a chunk of the long prompt, the short whole
    assert {e.output for e in scheduled.entries} == {"last"} and scheduled.floor == job_rank(Priority.NORMAL, False)
    sched.add(_request("urgent", _prompt(tiny_engine, 5, 3), priority=Priority.HIGH))
    scheduled = sched.schedule()  # an outranking prefill goes alone: the step's lowest rank is its own
    assert scheduled is not None and [rank(seq) for seq in scheduled.sequences] == [scheduled.floor] == [job_rank(Priority.HIGH, False)]


def test_the_phases_by_hand_are_the_step(tiny_engine: Any) -> None:
    runs = []
    for drive in (Scheduler.step, _by_hand):
        sched = Scheduler(tiny_engine, SchedulerConfig(prefix_cache=False, max_prefill_tokens=16))
        for i, n in enumerate((3, 40, 9)):
            sched.add(_request(f"r{i}", _prompt(tiny_engine, n, i), max_tokens=6))
        tokens: dict[str, list[int]] = {}
        while sched.has_work:
            for event in drive(sched):
                if isinstance(event, SequenceStep):
                    tokens.setdefault(event.request_id, []).append(event.output.token_id)
        runs.append(tokens)
    assert runs[0] == runs[1] and all(len(t) == 6 for t in runs[0].values())
