"""A job a worker has taken from a stream: what its loop needs to start, resume or end it (worker/serve/job_feeder.py
takes it, worker/serve/runner.py starts it)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.fair_queue import in_lane
from shared.messages import Job
from worker.failover.fencing import Grant
from worker.failover.resume import JournalState


@dataclass
class TakenJob:
    """A job this worker now owns, with what the loop needs to start, resume or end it."""

    stream: str
    message_id: str
    job: Job
    grant: Grant
    takeover: bool  # reclaimed from a dead or silent worker (or owned before: grant.previous)
    cancelled: bool = False  # its cancel marker was set when it was taken
    journal: JournalState | None = None  # takeovers: the journal as read after the fence went up
    journal_next_seq: int = 0  # takeovers whose journal is unusable: one past its highest seq
    journal_problem: str = ""  # why the journal is unusable ("" = usable or not read)
    dead_lettered: int = 0  # a poison job set aside: the deliveries it had (0 = not one)
    tenant: str = ""  # whose fair share it counts against (its stream entry's tenant field; "" where it has none)

    @property
    def newcomer(self) -> bool:
        """Whether the fair queue sent it up a class: its tenant had nothing waiting in a saturated class."""
        return in_lane(self.stream, self.job.model, self.job.priority)
