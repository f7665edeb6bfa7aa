"""A worker's own first requests, run before it registers, so a client's first request is as fast as its tenth.

A generative model's warm-up is two short streamed chat jobs run together through the path a client's request
takes: intake (the chat template, tokenizing), the scheduler (a prefill, then batched decode steps), sampling
(one greedy, one with temperature, top_k and top_p), a stop string, and the publisher turning each step into wire
events. Nothing is sent: the events are dropped, and the scheduler's counters are put back as they were. An
embedding model embeds one text. A warm-up that fails is logged and the worker registers anyway: it is an
optimisation, never a reason not to serve.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import Any

from shared.messages import ChatMessage, EmbedJob, GenerateJob, Job, Sampling
from worker.schedule.scheduler import Scheduler
from worker.serve.intake import JobIntake
from worker.serve.publisher import EventPublisher

log = logging.getLogger(__name__)
MAX_STEPS = 64  # a warm-up that has not ended after this many steps is cut short (its tokens are few)
WARMUP_TOKENS = 6
PROMPT = [ChatMessage(role="system", content="You are a helpful assistant."),
          ChatMessage(role="user", content="Name three colours, one per line.")]


def warmup_jobs(model: str, *, embedding_only: bool, chat: bool, worker_id: str) -> list[Job]:
    """The jobs a worker of `model` runs before it registers (ids that no client's request can have): chat jobs
    where the model has a chat template, completions where it has none."""
    now = time.time()
    common: dict[str, Any] = {"model": model, "created": now, "deadline": now + 600}
    if embedding_only:
        return [EmbedJob(id=f"warmup-{worker_id}-embed", inputs=["A short text to embed."], **common)]
    common |= {"max_tokens": WARMUP_TOKENS, "stream": True, "stop": ["\n\n\n"]}
    # a chat job as the gateway sends one: its reply's thinking split on (the engine's vocabulary scan for thinking
    # tokens, ~8 ms once, is paid here)
    common |= {"messages": PROMPT, "reasoning": True} if chat else {"prompt": PROMPT[-1].content}
    greedy = Sampling(temperature=0.0, seed=1)
    sampled = Sampling(temperature=0.7, top_k=40, top_p=0.9, seed=2)
    # the sampled one without a system message: the template's own default (SmolLM2's, Qwen's) is then in the KV
    # pool's prefix cache, as it is for a client's tenth request (else the first fills it from the host tier or
    # prefills it)
    user_only = {"messages": PROMPT[1:]} if chat else {}
    return [GenerateJob(id=f"warmup-{worker_id}-greedy", sampling=greedy, **common),
            GenerateJob(id=f"warmup-{worker_id}-sampled", sampling=sampled, **(common | user_only))]


def warm_up(intake: JobIntake, scheduler: Scheduler, publisher: EventPublisher, jobs: list[Job]) -> float:
    """Run `jobs` to their end through intake, scheduler and publisher, send nothing, and leave the scheduler's
    counters as they were; the seconds it took (a failure is logged, never raised)."""
    started = time.perf_counter()
    saved = copy.copy(scheduler.stats)
    try:
        for job in jobs:
            intake.start(job, cancelled=False)
        for _ in range(MAX_STEPS):
            if not scheduler.has_work:
                break
            publisher.add_steps(scheduler.step())
        for job in jobs:
            if scheduler.cancel(job.id) is not None:
                log.warning("warm-up job %s had not ended after %d steps; cancelled", job.id, MAX_STEPS)
    except Exception:
        log.exception("the warm-up request failed; serving anyway (the first request may be slow)")
    finally:
        for job in jobs:
            publisher.forget(job.id)
        _restore_counters(scheduler, saved)
    return time.perf_counter() - started


def _restore_counters(scheduler: Scheduler, saved: object) -> None:
    """Put the scheduler's request and token counters back (gauges such as KV use keep their live values)."""
    gauges = {"queue_depth", "active", "kv_bytes", "kv_peak_bytes", "kv_blocks_used", "kv_blocks_total", "tokens_left"}
    for field in dataclasses.fields(scheduler.stats):
        if field.name not in gauges:
            setattr(scheduler.stats, field.name, getattr(saved, field.name))
