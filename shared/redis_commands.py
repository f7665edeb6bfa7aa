"""The Redis commands both sides run, each rule written once for the synchronous and the asyncio client.

A read rule is a generator: it yields a round of commands (`call(...)`), receives their replies, and returns
what they mean. `run` executes it on a `redis.Redis`, `run_async` on a `redis.asyncio.Redis`, one
non-transactional pipeline per round, replies that are errors handed to the rule as exception objects (a
lost connection still raises). So the gateway (asyncio), the node agent and the workers (sync) read the
queue depth and the live workers, and create consumer groups, by the same code. A write rule queues its
commands on a pipeline the caller executes (redis-py's sync and asyncio pipelines queue alike).

Rules: `create_group` (BUSYGROUP, a group already there, is fine), `queue_states` (waiting / in flight /
placed / held per model over every stream of it), `streams_with_waiting` (which streams hold a job not yet
taken), `fresh_workers` (registry entries within the heartbeat
TTL), `queue_event` (journal first, then publish) and `queue_job_done` (XACK + XDEL). No redis import here:
the clients are the caller's.

`write_refusal` tells a Redis that answered and refused a write (OOM at maxmemory with noeviction, READONLY from a
replica or a demoted primary, MISCONF after a failed save) from one that cannot be reached: nothing is lost by a
refused write, it is retried, and a client is told what Redis said.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Generator
from typing import Any, NamedTuple, TypeVar

from shared import keys
from shared.registry import RegistryEntry

log = logging.getLogger(__name__)

T = TypeVar("T")
JOURNAL_MAXLEN = 100_000  # events kept per request (approximate trim)
FORGET_AFTER_TTLS = 10  # a worker id silent for this many heartbeat TTLs leaves the workers index


# (kind, what the reply says, words that tell it): the reply of a refused write, plain, in a pipeline or in a script
_REFUSALS = (
    ("OOM", "Redis is full", ("used memory > 'maxmemory'", "-OOM ")),
    ("READONLY", "Redis is read-only (a replica, or a primary demoted since)", ("READONLY", "read only replica")),
    ("MISCONF", "Redis refuses writes (its last save to disk failed)", ("MISCONF",)),
)


def write_refusal(error: object) -> str | None:
    """"OOM", "READONLY" or "MISCONF" when `error` is Redis refusing a write (it answered: nothing was written,
    a retry succeeds once it accepts writes again); None for anything else (unreachable, a timeout, a bug)."""
    if not isinstance(error, Exception):
        return None
    text = str(error)
    return next((kind for kind, _what, words in _REFUSALS if any(w in text for w in words)), None)


def describe_refusal(error: object) -> str | None:
    """What a refused write means, with Redis's own words: "Redis is full (OOM command not allowed when used memory >
    'maxmemory')"; None when `error` is not a refusal."""
    kind = write_refusal(error)
    if kind is None:
        return None
    what = next(w for k, w, _words in _REFUSALS if k == kind)
    said = re.split(r"caused error: |: -", str(error))[-1].strip().rstrip(".")  # Redis's words, unwrapped
    return f"{what} ({said if said.startswith(kind) else f'{kind} {said}'})"


class Call(NamedTuple):
    """One command: a redis-py client method's name and its arguments."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


Rule = Generator[list[Call], list[Any], T]  # yields rounds of calls, receives their replies, returns a result


def call(name: str, *args: Any, **kwargs: Any) -> Call:
    """A command of a rule's round, named as redis-py's client method (`call("xlen", stream)`)."""
    return Call(name, args, kwargs)


def run(redis: Any, rule: Rule[T]) -> T:
    """Run a rule on a synchronous client, each round in one pipeline."""
    try:
        calls = next(rule)
        while True:
            pipe = redis.pipeline(transaction=False)
            for name, args, kwargs in calls:
                getattr(pipe, name)(*args, **kwargs)
            calls = rule.send(pipe.execute(raise_on_error=False))
    except StopIteration as done:
        return done.value


async def run_async(redis: Any, rule: Rule[T]) -> T:
    """Run a rule on an asyncio client, each round in one pipeline."""
    try:
        calls = next(rule)
        while True:
            pipe = redis.pipeline(transaction=False)
            for name, args, kwargs in calls:
                getattr(pipe, name)(*args, **kwargs)
            calls = rule.send(await pipe.execute(raise_on_error=False))
    except StopIteration as done:
        return done.value


def create_group(stream: str) -> Rule[bool]:
    """Create a job stream's consumer group (and the stream) where missing, reading from the stream's start so
    entries already there stay readable; whoever comes first creates it (gateway or worker). True if created."""
    [reply] = yield [call("xgroup_create", stream, keys.JOBS_GROUP, id="0", mkstream=True)]
    if isinstance(reply, Exception):
        if "BUSYGROUP" not in str(reply):
            raise reply
        return False
    return True


class QueueState(NamedTuple):
    """A model's jobs by state, over its shared and per-worker streams and every priority class."""

    waiting: int  # queued, not yet taken
    in_flight: int  # taken, not yet acked
    placed: dict[str, int]  # worker id -> jobs waiting on its own streams
    held: dict[str, int]  # worker id -> jobs it took and has not acked (any stream of the model)


def queue_states(models: list[str], *, create_missing_groups: bool = False) -> Rule[dict[str, QueueState]]:
    """Each model's QueueState: the placed-workers sets, then every stream's group (lag, pending), length and
    consumers in one round. Acked jobs are deleted (`queue_job_done`), so where Redis cannot tell the lag,
    waiting = length - pending. With `create_missing_groups`, a shared stream without its group gets one
    (a per-worker stream's group is its worker's, or a drainer's, to create)."""
    placed_sets = yield [call("smembers", keys.placed_workers(model)) for model in models]
    streams: list[tuple[str, str, str]] = []  # (model, owner worker id or "", stream)
    for model, members in zip(models, placed_sets, strict=True):
        if isinstance(members, Exception):
            raise members
        streams += [(model, "", s) for s in keys.jobs_streams(model)]
        for worker_id in sorted(reply_text(m) for m in members):
            streams += [(model, worker_id, s) for s in keys.worker_jobs_streams(model, worker_id)]
    fair = [(model, keys.fair_keys(model, p)[0]) for model in models for p in keys.PRIORITY_ORDER]
    replies = yield [*(call("zcard", queue) for _m, queue in fair), *(c for _m, _o, stream in streams for c in (
        call("xinfo_groups", stream), call("xlen", stream), call("xinfo_consumers", stream, keys.JOBS_GROUP)))]
    states = {model: QueueState(0, 0, {}, {}) for model in models}
    for (model, _queue), count in zip(fair, replies, strict=False):  # waiting for their tenant's share
        states[model] = states[model]._replace(waiting=states[model].waiting + (count if isinstance(count, int) else 0))
    replies = replies[len(fair):]
    ungrouped = []
    for (model, owner, stream), groups, length, consumers in zip(streams, replies[::3], replies[1::3],
                                                                  replies[2::3], strict=True):
        if isinstance(length, Exception):
            raise length
        group = _jobs_group(groups)
        waiting, in_flight = _waiting_and_pending(group, int(length))
        if group is None and not owner:
            ungrouped.append(stream)
        state = states[model]
        states[model] = state._replace(waiting=state.waiting + waiting, in_flight=state.in_flight + in_flight)
        if owner:
            state.placed[owner] = state.placed.get(owner, 0) + waiting
        _add_held(state.held, consumers)
    for stream in ungrouped if create_missing_groups else []:
        yield from create_group(stream)
    return states


def streams_with_waiting(streams: list[str]) -> Rule[set[str]]:
    """Those of `streams` holding a job no consumer has taken yet, in one round (each stream's group and length,
    as `queue_states` counts them); a stream whose group is missing or whose replies are errors counts as one (the
    read that follows meets the error, as it would have without this look)."""
    replies = yield waiting_calls(streams)
    return waiting_streams(streams, replies)


def waiting_calls(streams: list[str]) -> list[Call]:
    """The calls `streams_with_waiting` makes (XINFO GROUPS and XLEN of each stream), to join another round."""
    return [c for stream in streams for c in (call("xinfo_groups", stream), call("xlen", stream))]


def waiting_streams(streams: list[str], replies: list[Any]) -> set[str]:
    """Those of `streams` holding a job not yet taken, from the replies of `waiting_calls(streams)`."""
    found = set()
    for stream, groups, length in zip(streams, replies[::2], replies[1::2], strict=True):
        group = _jobs_group(groups)
        if group is None or isinstance(length, Exception) or _waiting_and_pending(group, int(length))[0] > 0:
            found.add(stream)
    return found


def _jobs_group(groups: object) -> dict[str, Any] | None:
    """The job consumer group among a stream's XINFO GROUPS reply (None: missing, or the reply is an error)."""
    if not isinstance(groups, list):
        return None
    return next((g for g in groups if reply_text(g.get("name")) == keys.JOBS_GROUP), None)


def _waiting_and_pending(group: dict[str, Any] | None, length: int) -> tuple[int, int]:
    """(jobs not yet taken, jobs taken and not acked) of one stream. Acked jobs are deleted (`queue_job_done`),
    so where Redis cannot tell the group's lag, waiting = length - pending; without a group every entry waits."""
    if group is None:
        return length, 0
    pending = int(group.get("pending") or 0)
    lag = group.get("lag")  # None after deletions past the group's position
    return (int(lag) if lag is not None else max(0, length - pending)), pending


def _add_held(held: dict[str, int], consumers: object) -> None:
    """Add one stream's pending entries per consumer (a worker's id) to `held`; a missing group adds none."""
    if not isinstance(consumers, list):
        return
    for consumer in consumers:
        pending = int(consumer.get("pending") or 0)
        if pending:
            name = reply_text(consumer.get("name"))
            held[name] = held.get(name, 0) + pending


def fresh_workers(now: float, ttl_s: float) -> Rule[list[RegistryEntry]]:
    """Every worker whose registry entry is within the heartbeat TTL (ready or draining: `is_live` tells which
    may take new jobs); ids silent for FORGET_AFTER_TTLS TTLs leave the index. Malformed entries are logged."""
    ids = yield [call("zrangebyscore", keys.WORKERS_INDEX, now - ttl_s, "+inf")]
    if isinstance(ids[0], Exception):
        raise ids[0]
    ids = [reply_text(worker_id) for worker_id in ids[0]]
    replies = yield [*(call("hgetall", keys.worker_key(w)) for w in ids),
                     call("zremrangebyscore", keys.WORKERS_INDEX, "-inf", now - FORGET_AFTER_TTLS * ttl_s)]
    workers = []
    for worker_id, fields in zip(ids, replies, strict=False):
        entry = RegistryEntry.from_hash(worker_id, fields if isinstance(fields, dict) else {})
        if entry is None:
            if fields:
                log.warning("ignoring malformed registry entry of worker %s", worker_id)
        elif entry.heartbeat >= now - ttl_s:
            workers.append(entry)
    return workers


def queue_event(pipe: Any, model: str, request_id: str, seq: int, data: bytes, *, journal_ttl_s: int,
                refresh_ttl: bool) -> None:
    """Queue one encoded event of a job of `model`: journal it first (so a gap is always refillable), then publish
    it."""
    journal = keys.journal_stream(model, request_id)
    pipe.xadd(journal, {keys.JOURNAL_SEQ_FIELD: str(seq), keys.JOURNAL_EVENT_FIELD: data},
              maxlen=JOURNAL_MAXLEN, approximate=True)
    if refresh_ttl:
        pipe.expire(journal, journal_ttl_s)
    publish(pipe, keys.events_channel(model, request_id), data)


def sharded(client: Any) -> bool:
    """Whether a client (or its pipeline) talks to a Redis Cluster (REDIS_CLUSTER=1), where llmfleet's channels use
    sharded pub/sub: SPUBLISH reaches the subscribers on the node that owns the channel's slot only."""
    return type(client).__module__ in ("redis.cluster", "redis.asyncio.cluster")


def publish(pipe: Any, channel: str, data: bytes) -> None:
    """Queue (or send) a publish on `channel`: SPUBLISH on a Redis Cluster, else PUBLISH."""
    if sharded(pipe):
        pipe.spublish(channel, data)
    else:
        pipe.publish(channel, data)


def queue_job_done(pipe: Any, stream: str, message_id: str | bytes) -> None:
    """Queue XACK + XDEL of a finished job: the stream keeps only waiting and in-flight jobs, so
    XLEN - pending is the queue depth `queue_states` reads (Redis 6.2 has no consumer-group lag)."""
    pipe.xack(stream, keys.JOBS_GROUP, message_id)
    pipe.xdel(stream, message_id)


def reply_text(value: object) -> str:
    """A Redis reply's value as text, whichever way the client decodes responses (bytes, or str already)."""
    return value.decode() if isinstance(value, bytes) else str(value)
