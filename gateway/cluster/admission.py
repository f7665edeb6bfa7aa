"""Admission by work: when a new request would finish, from the queue and the workers' measured throughput.

Each worker publishes with its heartbeat (smoothed over ~30 s): `stat.finish_rate` (requests ended per second),
`stat.token_rate` (tokens generated per second), `stat.finish_load` (sequences in flight while they were measured)
and `stat.tokens_left` (tokens its unfinished requests may still generate, max_tokens x n minus what they
generated). A request that must queue is admitted only if it is expected to FINISH within a share of its deadline,
by both measures:
- requests: everything in flight and waiting ahead of it, and itself, at the rate requests finish on a full
  worker;
- tokens: the tokens left in flight, plus the waiting jobs counted at this request's size, plus its own, at
  the rate a full worker generates tokens (a finish rate measured on short jobs would under-estimate long ones).
Both rates are what the worker showed, scaled to a full worker where it showed them under a lighter load: the
token rate by its slots over the load it was measured at, up to `stat.decode_capacity` (the rate of a full
decode step, measured at start), and the finish rate by as much as the token rate was. One stream's rates had
judged a burst on an 8-slot worker as if it would run one request at a time (of 64 at once with 120 s deadlines,
22 refused while the 42 admitted finished in 33 s; scaled, all 64 admitted and done in 45.5 s). A fresh worker has
generated nothing yet, so the token rate is at least half its decode capacity: a burst on fresh workers is judged
too, not only counted.
Otherwise it is refused at once with 429 and a Retry-After from the same estimate, instead of being admitted
to time out in the queue. A request that finds a free slot starts at once and is always admitted.

`decide` is the whole rule for a model with live workers, with no I/O: the broker (gateway/cluster/broker.py)
reads the registry and the queue, and calls it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shared.errors import InvalidRequest, QueueFull
from shared.messages import GenerateJob, Job
from shared.registry import RegistryEntry

WAIT_SHARE_OF_DEADLINE = 0.5  # admit while the expected finish is under this share of the deadline
MAX_RETRY_AFTER_S = 60
CAPACITY_SHARE = 0.5  # a worker's measured full-batch decode rate counts at this share (longer contexts, overheads)


def expected_finish_s(workers: Sequence[RegistryEntry], waiting: int, tokens: int = 0, *,
                      in_flight: int | None = None) -> float:
    """Seconds until a request of `tokens` (max_tokens x n) queued behind `waiting` others would finish; 0 when a
    slot is free or no worker has measured a rate yet (then only the queue's count limit applies). `in_flight`
    (jobs taken and not yet acked, read live from the streams) is the load when given: the heartbeats' load is up
    to a heartbeat plus the registry cache old, stale both ways (a burst that just started, or one that just ended
    and would make the next burst look like a full worker)."""
    load = in_flight if in_flight is not None else sum(w.load for w in workers)
    if waiting + load < sum(w.slots for w in workers):  # a slot is free: it starts at once
        return 0.0
    estimates = []
    finish_rate = sum(full_finish_rate(w) for w in workers)
    if finish_rate > 0:
        estimates.append((load + waiting + 1) / finish_rate)
    token_rate = sum(full_token_rate(w) for w in workers)
    if token_rate > 0 and tokens > 0:
        left = sum(w.stats.get("tokens_left", 0.0) for w in workers)
        estimates.append((left + (waiting + 1) * tokens) / token_rate)
    return max(estimates, default=0.0)


def full_token_rate(worker: RegistryEntry) -> float:
    """Tokens a second the worker generates full: its measured rate, scaled by its slots over the load it was
    measured at up to its decode capacity, and at least CAPACITY_SHARE of that capacity (a fresh worker)."""
    stats = worker.stats
    measured, capacity = stats.get("token_rate", 0.0), stats.get("decode_capacity", 0.0)
    measured_load = stats.get("finish_load", 0.0)
    scaled = min(capacity, measured * worker.slots / measured_load) if measured_load > 0 else 0.0
    return max(measured, scaled, CAPACITY_SHARE * capacity)


def full_finish_rate(worker: RegistryEntry) -> float:
    """Requests a second the worker finishes full: its measured finish rate times how much faster it generates
    tokens full than it did while measured (full_token_rate over token_rate), at most by as much as it is fuller
    (slots over `finish_load`); as measured where either is unknown (a worker that generates no tokens:
    embeddings)."""
    stats = worker.stats
    rate, measured = stats.get("finish_rate", 0.0), stats.get("token_rate", 0.0)
    measured_load = stats.get("finish_load", 0.0)
    if rate <= 0 or measured <= 0 or measured_load <= 0:
        return rate
    boost = min(full_token_rate(worker) / measured, worker.slots / measured_load)
    return rate * max(1.0, boost)


def retry_after_s(expected_finish: float, budget: float) -> float:
    """When trying again may be admitted: once the work ahead has shrunk below the budget (1 to 60 s)."""
    return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(expected_finish - budget))))


def check_width(job: Job, workers: Sequence[RegistryEntry]) -> None:
    """Raise InvalidRequest when the job's n is wider than any live worker runs at once."""
    widest = max(w.slots for w in workers)
    if isinstance(job, GenerateJob) and widest and job.n > widest:
        raise InvalidRequest(f"n is {job.n}, but the workers of model '{job.model}' run at most {widest} "
                             "sequences at once.", param="n")


def decide(job: Job, workers: Sequence[RegistryEntry], waiting: int, in_flight: int, *, queue_limit: int,
           request_timeout_s: float, default_max_tokens: int, retry_after: float) -> None:
    """Admit `job` (its width already checked) for a model whose live `workers` are given, with `waiting` jobs ahead
    of it (queued, and admitted but not yet written) and `in_flight` taken; raise QueueFull."""
    model, generate = job.model, isinstance(job, GenerateJob)
    if waiting >= queue_limit:
        raise QueueFull(f"model '{model}' has {waiting} requests waiting, the limit is {queue_limit}; please retry",
                        retry_after=retry_after)
    tokens = 0
    if generate:
        tokens = (job.max_tokens if job.max_tokens is not None else default_max_tokens) * job.n
    expected = expected_finish_s(workers, waiting, tokens, in_flight=in_flight)
    budget = request_timeout_s * WAIT_SHARE_OF_DEADLINE
    if expected > budget:
        raise QueueFull(
            f"model '{model}' has {waiting} requests waiting, about {expected:.0f} s of work at the "
            f"rate its workers finish them; this one could not finish well before its deadline; "
            "please retry", retry_after=retry_after_s(expected, budget))
