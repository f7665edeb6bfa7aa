"""Preemption by recompute, the policy: which sequence goes (worker/schedule/admission.py frees and requeues it).

A preempted sequence's KV blocks are freed and it is requeued at the front of its priority class; when it is
admitted again it prefills its prompt and the tokens it had generated, and goes on from the
same generation state (sampler and all), so a greedy or seeded choice continues exactly as it would have.

Two reasons to preempt: the running decodes need more KV than is free (the lowest-priority, most recently
admitted sequence goes), and priority (vLLM's priority scheduling): a waiting request that outranks running
sequences and finds no free slot or KV preempts the lowest of them until it fits; a fair-share newcomer (a tenant
with nothing waiting in a saturated class, shared/fair_queue.py) outranks its own class so. While a request prefills,
the decodes it outranks sit the step out (they keep their KV), so its first token comes as fast as on an
idle worker; they go on the step after.
"""

from __future__ import annotations

from worker.schedule.sequences import Priority, ScheduledSequence, SeqState

TOP_RANK = 2 * int(max(Priority))  # nothing outranks a critical job (there is no class above to send one up)


def job_rank(priority: Priority, newcomer: bool) -> int:
    """A job's rank (higher runs first): twice its class, plus one for a newcomer, which the fair queue sent up a
    class (shared/fair_queue.py) and which so ranks between its class and the one above."""
    return 2 * int(priority) + int(newcomer)


def rank(seq: ScheduledSequence) -> int:
    """A sequence's rank (job_rank of its request)."""
    request = seq.group.request
    return job_rank(request.priority, request.newcomer)


def kv_victim(active: list[ScheduledSequence]) -> ScheduledSequence:
    """The sequence to preempt when the running decodes need more KV than is free: the lowest-priority, most
    recently admitted one (choices waiting to share its prompt go with it)."""
    victims = [s for s in active if s.fork_from is None]
    if len(victims) <= 1 and not any(s.fork_from for s in active):
        raise RuntimeError("a single sequence exceeds the KV pool")  # add() prevents this
    return min(victims, key=lambda s: (rank(s), -s.admit_order))


def priority_victim(active: list[ScheduledSequence], waiting: ScheduledSequence) -> ScheduledSequence | None:
    """The lowest-ranked running sequence that `waiting` outranks (most recently admitted first); None when
    there is none (the waiting request must wait for a slot like any other)."""
    victims = [s for s in active if s.fork_from is None and rank(s) < rank(waiting)]
    return min(victims, key=lambda s: (rank(s), -s.admit_order)) if victims else None


def not_outranked(sequences: list[ScheduledSequence], active: list[ScheduledSequence]) -> list[ScheduledSequence]:
    """Those of `sequences` that run this step: every one not outranked by a sequence now prefilling (while a
    request prefills, the decodes and prefills it outranks sit the step out, keeping their KV)."""
    floor = max((rank(s) for s in active if s.state == SeqState.PREFILLING), default=None)
    if floor is None:
        return sequences
    return [s for s in sequences if rank(s) >= floor]
