"""Fair shares within a priority class: the fair queue every job for a model's shared stream goes through.

Fair shares within a priority class (`FAIR_SCRIPT`, `queue_fair`, `release_fair`): a job for a model's shared stream
first waits in its class's fair queue, tagged with a virtual start time (start-time fair queueing: max(the queue's
virtual time, its tenant's finish tag); the tenant's finish tag then grows by the job's token work over the tenant's
weight), and is released into the stream in tag order whenever the stream holds fewer jobs not yet taken than the
releaser asks for: a gateway asks for one (an idle worker wakes), a worker for as many as it has room for, just
before it reads. So one tenant's burst waits in the fair queue, not in the stream, and another tenant's single job
is released next, whichever gateway queued it and whichever worker frees a slot.

A newcomer (a tenant with no job of the class queued or waiting untaken) that finds its class saturated (every
worker full at its last heartbeat, jobs queued in the fair queue, or the stream's ready job not yet taken) skips the
queue: its job goes into the shared stream of the class above, so a full worker takes it the moment it is written, as
it takes any job that outranks running work, and its scheduler ranks it between the two classes
(worker/schedule/preemption.py `job_rank`): it preempts the most recently admitted job of its own class when no slot
is free, and prefills alone. So a tenant's single request does not wait for another tenant's wave of jobs to end
(issue 42: TTFT within 2x of idle). The tenant travels as a field of the stream entry beside the job's bytes (a worker
that predates it reads the job as before). Workers count a taken job's tenant off (`queue_taken`); the counts expire
with the class's keys, so a count that a lost job leaves behind (a stream trimmed at its maxlen) heals when the class
goes quiet. In the top class there is no class above: its newcomers queue as any job.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from shared import keys
from shared.redis_commands import Call, Rule, call, waiting_calls, waiting_streams

log = logging.getLogger(__name__)


# KEYS: fair queue (zset id -> start tag), its jobs (hash id -> bytes), its state (hash: vtime, t:<tenant> -> finish
# tag, j:<id> -> a queued job's tenant), the class's shared stream; for an enqueue also the class's untaken counts
# (hash tenant -> jobs queued or waiting, not yet taken) and the stream a newcomer goes to (the class above's shared
# stream; the class's own at the top). ARGV: op ("enqueue" or "release"), ready, maxlen, group; enqueue adds id, job
# bytes, tenant, cost, weight, ttl_s and whether the gateway saw every worker full ("1"). An enqueue of a newcomer (a
# tenant with no job untaken) while the class is saturated (every worker full, its queue holding jobs, or its stream
# `ready` waiting) goes to that stream. Every entry the script writes carries the job's tenant beside it
# (keys.TENANT_FIELD; none for a job an older gateway queued). After any other enqueue, and on a release, jobs are
# released in tag order while the stream has fewer than `ready` waiting; returns how many it released (a newcomer
# counts one). An enqueue with four keys (a gateway older than the newcomer lane) skips the lane.
FAIR_SCRIPT = """
local op, ready, maxlen, group = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local function waiting_in(stream)
  local ok, summary = pcall(redis.call, 'XPENDING', stream, group)
  return redis.call('XLEN', stream) - ((ok and summary[1]) or 0)
end
if op == 'enqueue' then
  local id, tenant, cost, weight = ARGV[5], 't:' .. ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
  local vtime = tonumber(redis.call('HGET', KEYS[3], 'vtime') or '0')
  local start = math.max(vtime, tonumber(redis.call('HGET', KEYS[3], tenant) or '0'))
  redis.call('HSET', KEYS[3], tenant, string.format('%.17g', start + cost / weight))
  if #KEYS >= 6 then
    local before = tonumber(redis.call('HGET', KEYS[5], ARGV[7]) or '0')
    redis.call('HINCRBY', KEYS[5], ARGV[7], 1)
    redis.call('EXPIRE', KEYS[5], ARGV[10])
    local saturated = ARGV[11] == '1' or redis.call('EXISTS', KEYS[1]) == 1 or waiting_in(KEYS[4]) >= ready
    if before <= 0 and KEYS[6] ~= KEYS[4] and saturated then
      redis.call('XADD', KEYS[6], 'MAXLEN', '~', maxlen, '*', 'job', ARGV[6], 'tenant', ARGV[7])
      redis.call('EXPIRE', KEYS[3], ARGV[10])
      return 1
    end
  end
  redis.call('ZADD', KEYS[1], string.format('%.17g', start), id)
  redis.call('HSET', KEYS[2], id, ARGV[6])
  redis.call('HSET', KEYS[3], 'j:' .. id, ARGV[7])
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[10]) end
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local waiting = waiting_in(KEYS[4])
local moved = 0
while waiting < ready do
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #head == 0 then break end
  local job, owner = redis.call('HGET', KEYS[2], head[1]), redis.call('HGET', KEYS[3], 'j:' .. head[1])
  redis.call('ZREM', KEYS[1], head[1])
  redis.call('HDEL', KEYS[2], head[1])
  redis.call('HDEL', KEYS[3], 'j:' .. head[1])
  redis.call('HSET', KEYS[3], 'vtime', head[2])
  if job and owner then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', maxlen, '*', 'job', job, 'tenant', owner)
    moved, waiting = moved + 1, waiting + 1
  elseif job then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', maxlen, '*', 'job', job)
    moved, waiting = moved + 1, waiting + 1
  end
end
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) end
return moved
"""
FAIR_SHA = hashlib.sha1(FAIR_SCRIPT.encode()).hexdigest()  # workers' frequent releases send the script's digest
GATEWAY_READY = 1  # a gateway releases jobs while the stream has fewer than this waiting (so an idle worker wakes)


class FairJob(NamedTuple):
    """A job for a class's fair queue: its tenant, its token work (the cost) and the tenant's weight."""

    request_id: str
    data: bytes  # codec bytes
    tenant: str
    cost: float
    weight: float
    ttl_s: int  # the fair queue's keys expire this long after (the job's deadline, with a margin)


def queue_fair(pipe: Any, model: str, priority: str, job: FairJob, *, maxlen: int, full: bool = False) -> None:
    """Queue the script call that puts a job in its class's fair queue (a saturated class's newcomer in the class
    above's stream) and releases the head of that queue into the shared stream while it has fewer than
    GATEWAY_READY jobs waiting (an idle worker wakes to it)."""
    scripted = [*keys.fair_keys(model, priority), *keys.fair_lane_keys(model, priority)]
    pipe.execute_command("EVAL", FAIR_SCRIPT, 6, *scripted, "enqueue", GATEWAY_READY, maxlen, keys.JOBS_GROUP,
                         job.request_id, job.data, job.tenant, job.cost, max(job.weight, 1e-6), max(1, job.ttl_s),
                         int(full))  # not pipe.eval(): redis-py's sync cluster pipeline lacks it


def release_calls(model: str, rooms: dict[str, int], *, maxlen: int) -> list[Call]:
    """The script calls (by digest) that release each class's fair queue into its shared stream until the stream
    has as many jobs waiting as `rooms` says for that class (a worker's free slots for it, read right after)."""
    # EVALSHA through execute_command: redis-py's cluster pipeline refuses evalsha() (it routes the command by its keys)
    return [call("execute_command", "EVALSHA", FAIR_SHA, 4, *keys.fair_keys(model, priority), "release", room, maxlen,
                 keys.JOBS_GROUP) for priority, room in rooms.items() if room > 0]


def released(replies: list[Any], releases: Sequence[Call]) -> Rule[int]:
    """How many jobs the replies of `releases` (release_calls) released; where Redis lacks the script (restarted: a
    gateway's next enqueue or this brings it back), it is loaded for the next look by an EVAL of the same keys that
    releases nothing (so on a Redis Cluster it reaches the node that said NOSCRIPT), and a class whose call failed
    releases nothing now (its jobs wait for the next look)."""
    for reply in replies:
        if isinstance(reply, Exception):
            log.debug("releasing a fair queue failed: %s", reply)
    loads = [call("execute_command", "EVAL", FAIR_SCRIPT, 4, *release.args[3:7], "release", 0, *release.args[9:])
             for release, reply in zip(releases, replies, strict=False)
             if isinstance(reply, Exception) and _no_script(reply)]
    if loads:
        yield loads
    return sum(reply for reply in replies if isinstance(reply, int))


def _no_script(error: Exception) -> bool:
    """Whether Redis answered NOSCRIPT (redis-py's NoScriptError; its text drops the code)."""
    return type(error).__name__ == "NoScriptError" or "NOSCRIPT" in str(error) or "No matching script" in str(error)


def release_fair(model: str, rooms: dict[str, int], *, maxlen: int) -> Rule[int]:
    """Run `release_calls` in one round; how many jobs were released (see `released`)."""
    releases = release_calls(model, rooms, maxlen=maxlen)
    replies = yield releases
    return (yield from released(replies, releases))


# KEYS: a class's untaken counts (FAIR_SCRIPT's KEYS[5]). ARGV: the tenants of jobs a worker has just taken, one each.
TAKEN_SCRIPT = """
for i = 1, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 and redis.call('HINCRBY', KEYS[1], ARGV[i], -1) <= 0 then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return #ARGV
"""


def queue_taken(pipe: Any, model: str, taken: Sequence[tuple[str, str]]) -> None:
    """Queue the script calls that count jobs of (class, tenant) as taken by a worker: their tenants are no longer
    waiting (a tenant with nothing waiting is a newcomer again). A count already expired stays gone."""
    by_class: dict[str, list[str]] = {}
    for priority, tenant in taken:
        if tenant:
            by_class.setdefault(priority, []).append(tenant)
    for priority, tenants in by_class.items():
        pipe.execute_command("EVAL", TAKEN_SCRIPT, 1, keys.fair_lane_keys(model, priority)[0], *tenants)


def in_lane(stream: str, model: str, priority: str) -> bool:
    """Whether a job of class `priority` read from `stream` is a newcomer the fair queue sent up a class."""
    order = keys.PRIORITY_ORDER
    return any(stream == keys.jobs_stream(model, above) for above in order[: order.index(priority)])


def release_and_look(releases: Sequence[Call], streams: list[str]) -> Rule[set[str]]:
    """Run `releases` (release_calls) and, in the same round, tell which of `streams` hold a job not yet taken
    (shared/redis_commands.py streams_with_waiting)."""
    replies = yield [*releases, *waiting_calls(streams)]
    yield from released(replies[: len(releases)], releases)
    return waiting_streams(streams, replies[len(releases):])
