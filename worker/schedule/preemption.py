"""Preemption by recompute: a sequence's KV blocks are freed and it is requeued at the front of its priority
class; when it is admitted again it prefills its prompt and the tokens it had generated, and goes on from the
same generation state (sampler and all), so a greedy or seeded choice continues exactly as it would have.

Two reasons to preempt: the running decodes need more KV than is free (the lowest-priority, most recently
admitted sequence goes), and priority (vLLM's priority scheduling): a waiting request that outranks running
sequences and finds no free slot or KV preempts the lowest of them until it fits. While a request prefills,
the decodes it outranks sit the step out (they keep their KV), so its first token comes as fast as on an
idle worker; they go on the step after.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from worker.schedule.sequences import ScheduledSequence, SeqState

if TYPE_CHECKING:
    from worker.schedule.scheduler import Scheduler

log = logging.getLogger(__name__)


def _rank(seq: ScheduledSequence) -> int:
    return int(seq.group.request.priority)


def preempt(scheduler: Scheduler, victim: ScheduledSequence) -> None:
    """Free a sequence's blocks (and those of choices waiting to share its prompt) and requeue them at the front
    of their priority class."""
    followers = [s for s in scheduler._active if s.fork_from is victim]
    for seq in [victim, *followers]:
        scheduler._free(seq)
        seq.pooled = None
        seq.fork_from = None
        seq.was_preempted = True
        scheduler._active.remove(seq)
        scheduler._push_waiting(seq, front=True)
    scheduler.stats.preemptions += 1
    log.info("preempted request %s choice %d", victim.group.request.request_id, victim.index)


def preempt_for_kv(scheduler: Scheduler) -> None:
    """Free the blocks of the lowest-priority, most recently admitted sequence and requeue it at the front."""
    victims = [s for s in scheduler._active if s.fork_from is None]
    if len(victims) <= 1 and not any(s.fork_from for s in scheduler._active):
        raise RuntimeError("a single sequence exceeds the KV pool")  # add() prevents this
    preempt(scheduler, min(victims, key=lambda s: (_rank(s), -s.admit_order)))


def preempt_for_priority(scheduler: Scheduler, waiting: ScheduledSequence) -> bool:
    """Preempt the lowest-ranked running sequence that `waiting` outranks (most recently admitted first);
    False when there is none (the waiting request must wait for a slot like any other)."""
    victims = [s for s in scheduler._active if s.fork_from is None and _rank(s) < _rank(waiting)]
    if not victims:
        return False
    victim = min(victims, key=lambda s: (_rank(s), -s.admit_order))
    log.info("request %s (priority %d) waits with no room: preempting request %s (priority %d)",
             waiting.group.request.request_id, _rank(waiting), victim.group.request.request_id, _rank(victim))
    preempt(scheduler, victim)
    return True


def not_outranked(sequences: list[ScheduledSequence], active: list[ScheduledSequence]) -> list[ScheduledSequence]:
    """Those of `sequences` that run this step: every one not outranked by a sequence now prefilling (while a
    request prefills, the decodes and prefills it outranks sit the step out, keeping their KV)."""
    floor = max((_rank(s) for s in active if s.state == SeqState.PREFILLING), default=None)
    if floor is None:
        return sequences
    return [s for s in sequences if _rank(s) >= floor]


def rank(seq: ScheduledSequence) -> int:
    """A sequence's priority as a number (higher runs first)."""
    return _rank(seq)
