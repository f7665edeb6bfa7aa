"""A job for a model's shared stream goes through its class's fair queue (shared/fair_queue.py FAIR_SCRIPT):
its tenant (gateway/http/tenants.py), its weight and its token work, estimated without tokenizing."""

from __future__ import annotations

import math
from typing import Any

from gateway.http.tenants import current_tenant
from shared import codec, keys
from shared.fair_queue import FairJob, queue_fair
from shared.messages import EmbedJob, GenerateJob, Job
from shared.settings import Settings

CHARS_PER_TOKEN = 4  # the estimate of a prompt's tokens from its characters (the gateway does not tokenize)
UNBOUNDED_OUTPUT_TOKENS = 256  # the work counted for a request without max_tokens
KEYS_MARGIN_S = 60  # the fair queue's keys outlive the latest job's deadline by this


def job_cost(job: Job) -> float:
    """A job's token work: prompt tokens (estimated) plus the tokens it may generate, over all its choices."""
    if isinstance(job, GenerateJob):
        if job.messages is not None:
            chars = sum(len(m.content) for m in job.messages)
        else:
            chars = len(job.prompt or "") + CHARS_PER_TOKEN * len(job.prompt_token_ids or [])
        output = job.max_tokens if job.max_tokens is not None else UNBOUNDED_OUTPUT_TOKENS
        return max(1.0, chars / CHARS_PER_TOKEN + output * job.n)
    if isinstance(job, EmbedJob):
        chars = sum(len(x) if isinstance(x, str) else CHARS_PER_TOKEN * len(x) for x in job.inputs)
        return max(1.0, chars / CHARS_PER_TOKEN)
    return 1.0


def queue_shared(pipe: Any, job: Job, settings: Settings, now: float, *, full: bool = False) -> None:
    """Queue the writing of `job` for its model's shared stream: through its class's fair queue, or straight into
    the stream with LLMFLEET_FAIR_SHARES=0. `full`: every worker of the model is full (the class is saturated even
    with nothing queued: a newcomer skips the queue, shared/fair_queue.py)."""
    if not settings.fair_shares:
        pipe.xadd(keys.jobs_stream(job.model, job.priority), {keys.JOB_FIELD: codec.encode_job(job)},
                  maxlen=settings.stream_maxlen, approximate=True)
        return
    tenant, weight = current_tenant()
    ttl_s = math.ceil(job.deadline - now) + KEYS_MARGIN_S
    queue_fair(pipe, job.model, job.priority, FairJob(job.id, codec.encode_job(job), tenant, job_cost(job), weight,
                                                      ttl_s), maxlen=settings.stream_maxlen, full=full)
