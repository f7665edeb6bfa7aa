"""Starting one taken job: into the scheduler, or ended at once with its terminal event.

A job whose deadline passed or whose cancel marker was set ends before it starts; a text job (tokenize,
detokenize, apply a template) is answered at once; an embedding or a generation goes to the scheduler (a
generation taken over continues from its journal: worker/failover/continuation.py). A job the engine refuses
ends with the error in the client's terms; no job can take the worker down. Nothing here waits on Redis: the
terminal events go to the publisher's queue.
"""

from __future__ import annotations

import logging
import time

from redis import Redis

from shared.errors import DeadlineExceeded, InternalError, InvalidRequest, LLMFleetError
from shared.messages import ChoiceEndEvent, DoneEvent, EmbedJob, GenerateJob, Job, TextJob, TokenEvent, Usage
from worker.engine.engine import Engine
from worker.engine.errors import EngineError
from worker.failover.continuation import resume_from_journal
from worker.failover.prewarm import TakeoverWarmer
from worker.failover.resume import JournalState
from worker.loras import AdapterSet
from worker.schedule.scheduler import Scheduler
from worker.schedule.sequences import GenerationRequest
from worker.serve.jobs import embedding_request, generation_request, prompt_ids_of, text_answer
from worker.serve.publisher import EventPublisher

log = logging.getLogger(__name__)


class JobIntake:
    """Turns a taken job into scheduler work, or into its terminal event when it ends at once."""

    def __init__(self, engine: Engine, scheduler: Scheduler, publisher: EventPublisher, adapters: AdapterSet,
                 redis: Redis, *, default_max_tokens: int, causal_embeddings: bool = False) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.publisher = publisher
        self.adapters = adapters
        self.redis = redis
        self.default_max_tokens = default_max_tokens
        self.causal_embeddings = causal_embeddings  # a generative model serves embeddings (else they are a 400)

    def start(self, job: Job, *, cancelled: bool, resume: JournalState | None = None,
              fair: tuple[str, bool] = ("", False)) -> int | None:
        """Start a job (or continue one taken over, from its journal): the slots it holds, or None when it
        ended at once (deadline passed, cancelled, answered now, refused) with its terminal event queued. `fair`
        is (its tenant, whether the fair queue sent it up a class as a newcomer): a newcomer ranks above its class
        while its tenant holds less than an equal share of it."""
        if time.time() > job.deadline:
            self.publisher.add_error(job.id, DeadlineExceeded("the request's deadline passed before it started"))
            return None
        if cancelled:  # its cancel marker was set when the feeder took it
            self.end_without_tokens(job, "cancelled", prompt_tokens=0)
            return None
        log.info("job %s", job.describe())
        try:
            return self._submit(job, resume, fair)
        except LLMFleetError as exc:
            error = exc
        except (ValueError, EngineError) as exc:
            error = InvalidRequest(str(exc))
        except Exception as exc:  # one bad job must never take the worker down
            log.exception("job %s failed on intake", job.id)
            error = InternalError(f"the worker could not start this request ({type(exc).__name__})")
        self.publisher.add_error(job.id, error)
        return None

    def _submit(self, job: Job, resume: JournalState | None, fair: tuple[str, bool]) -> int | None:
        """Hand a job to the scheduler, or answer it now: the slots it holds, None when it already ended."""
        if isinstance(job, TextJob):  # answered now: no batch slot, nothing held
            answer = text_answer(self.engine, job)
            self.publisher.add_event(DoneEvent(id=job.id, seq=self.publisher.next_seq(job.id),
                                               usage=Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0),
                                               **answer))
            return None
        if isinstance(job, EmbedJob):
            self.scheduler.add_embedding(embedding_request(self.engine, job, causal_embeddings=self.causal_embeddings))
            return 1
        request = self._generation_request(job, resume)
        request.tenant = fair[0]
        request.newcomer = fair[1] and self.scheduler.admission.below_share(fair[0], request.priority)
        if job.echo and request.prompt_logprobs is None and (resume is None or not resume.echoed):
            self._echo_prompt(job, request.prompt_ids)
        if request.params.max_tokens == 0 and request.prompt_logprobs is None:  # no tokens, finish "length"
            self.end_without_tokens(job, "length", prompt_tokens=len(request.prompt_ids))
            return None
        self.scheduler.add(request)
        return job.n

    def _generation_request(self, job: GenerateJob, resume: JournalState | None) -> GenerationRequest:
        """The scheduler request of a generation job, its adapters resolved, resumed from a journal if given."""
        loras = self.adapters.resolve(job.loras, self.redis) if job.loras else ()
        request = generation_request(self.engine, job, default_max_tokens=self.default_max_tokens, loras=loras)
        if resume is not None:
            resume_from_journal(request, resume, job.n)
        return request

    def warm(self, warmer: TakeoverWarmer | None, *, busy: bool) -> None:
        """Warm the takeovers of the suspect workers' jobs the feeder found (worker/failover/prewarm.py): one a turn
        while the loop has work (its step waits for the copy), all of them when it is idle."""
        for suspect in warmer.drain(1 if busy else None) if warmer is not None else ():
            self._warm_one(suspect.job, suspect.journal)

    def _warm_one(self, job: GenerateJob, journal: JournalState) -> int:
        """Copy the host tier's blocks of a suspect worker's job (each unfinished choice: its prompt and the tokens
        already sent) into the pool's prefix cache, so that its takeover finds them there; returns the tokens
        warmed. A job that cannot be read warms nothing."""
        tier = getattr(self.scheduler, "tier", None)
        if tier is None or job.loras or not job.cache_prompt or (job.echo and job.logprobs is not None):
            return 0  # as admission: no tier read without the prefix cache, nor for adapters or a scored prompt
        try:
            prompt_ids = prompt_ids_of(self.engine, job)
        except (LLMFleetError, ValueError, EngineError):
            return 0
        return sum(tier.fill(prompt_ids + journal.tokens.get(i, [])) for i in range(job.n) if i not in journal.ended)

    def _echo_prompt(self, job: GenerateJob, prompt_ids: list[int]) -> None:
        """Send the prompt's text as every choice's first event (echo without prompt logprobs)."""
        text = self.engine.tokenizer.decode(prompt_ids, skip_special=False)
        for index in range(job.n):
            self.publisher.add_event(TokenEvent(id=job.id, seq=self.publisher.next_seq(job.id), index=index,
                                                text=text, token_ids=list(prompt_ids), echo=True))

    def end_without_tokens(self, job: Job, reason: str, *, prompt_tokens: int) -> None:
        """End a job with no generated tokens: every choice ends with `reason`, then Done (e.g. cancelled while
        it waited in the stream, or max_tokens 0)."""
        for index in range(job.n if isinstance(job, GenerateJob) else 0):
            self.publisher.add_event(ChoiceEndEvent(id=job.id, seq=self.publisher.next_seq(job.id), index=index,
                                                    finish_reason=reason))
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=0, total_tokens=prompt_tokens)
        self.publisher.add_event(DoneEvent(id=job.id, seq=self.publisher.next_seq(job.id), usage=usage))
