"""What a worker does with a job it took over from a dead or stalled worker: the decision, from the job's journal.

The feeder reads the journal after the fence went up (worker/failover/fencing.py), so nothing the old owner
writes later can land in the stream. One of:
- ACK: the journal ends with a terminal event: the request ended and only the ack was missing;
- DEAD_LETTER: a poison job (delivered past LLMFLEET_MAX_DELIVERIES without an ack, set aside by the feeder):
  it ends with DeadLettered;
- START: the journal is readable and nothing was sent yet: it starts like a new job;
- UNRESUMABLE: the journal is unusable, or the job is not a generation: it ends with Unavailable (the client
  retries);
- RESUME: every choice replays the tokens it already sent (worker/failover/resume.py) and goes on from the next
  seq, so the client's stream continues as if nothing happened.
"""

from __future__ import annotations

import logging
from enum import Enum

from shared.errors import DeadLettered, LLMFleetError, Unavailable
from shared.messages import GenerateJob, Job
from worker.failover.resume import JournalState
from worker.schedule.sequences import GenerationRequest

log = logging.getLogger(__name__)


class Continuation(Enum):
    """How a job taken over goes on."""

    ACK = "ack"
    DEAD_LETTER = "dead_letter"
    START = "start"
    UNRESUMABLE = "unresumable"
    RESUME = "resume"


def continuation(job: Job, journal: JournalState | None, next_seq: int, dead_lettered: int) -> Continuation:
    """Decide how a job taken over goes on, from its journal as read after the fence went up (None: unusable)."""
    if journal is not None and journal.terminal:
        return Continuation.ACK
    if dead_lettered:
        return Continuation.DEAD_LETTER
    if journal is not None and next_seq == 0:
        return Continuation.START
    if journal is None or not isinstance(job, GenerateJob):
        return Continuation.UNRESUMABLE
    return Continuation.RESUME


def ending_error(how: Continuation, job: Job, deliveries: int, max_deliveries: int) -> LLMFleetError:
    """The error a job taken over ends with when it cannot go on (DEAD_LETTER or UNRESUMABLE)."""
    if how is Continuation.DEAD_LETTER:
        log.warning("dead-lettered job %s: delivered %d times without finishing (LLMFLEET_MAX_DELIVERIES=%d)",
                    job.id, deliveries, max_deliveries)
        return DeadLettered(
            f"this request was started {deliveries} times and every worker running it stopped before it "
            "finished; it was set aside and will not be retried")
    return Unavailable("the worker serving this request stopped and the request cannot be resumed; please retry",
                       retry_after=1.0)


def resume_from_journal(request: GenerationRequest, journal: JournalState, n: int) -> None:
    """Give a request what the previous worker already sent: each choice's tokens, the choices that ended, and
    no prompt scoring when the echo (with its prompt logprobs) went out before the takeover."""
    request.resume_tokens = [journal.tokens.get(i, []) for i in range(n)]
    request.resume_ended = set(journal.ended)
    if journal.echoed:
        request.prompt_logprobs = None
