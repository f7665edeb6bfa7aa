"""Other workers' per-worker job streams (prefix-aware placement): draining dead ones, stealing from lagging ones.

The gateway places a job on `jobs@w:{worker}@{priority}:{model}` (gateway/cluster/placement.py) and adds the worker to
`{model}:placed`. Every worker reads its own streams first; with free slots left and nothing to read there or
on the shared streams, it looks at the other members of the set:
  - a member with no registry entry (dead) or not "ready" (draining): its waiting jobs are read at once;
  - a live member: only its jobs that have waited past LLMFLEET_STEAL_AFTER_S (its worker is busy) are read.
Reading is XREADGROUP in the one consumer group, so a job is delivered once whoever reads it, and taking it
goes through the same fencing (worker/failover/fencing.py) as the shared streams. Pending entries of dead or silent
consumers on every member stream are reclaimed (worker/failover/takeover.py) as on the shared ones, dead-letter
included. A dead member whose streams hold nothing (no entry waiting, nothing pending) is forgotten: its
streams are deleted and it leaves the set, in one script (a gateway placing on it at that moment adds it
again, and its entry is read as above).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from redis.exceptions import ResponseError

from shared import keys, redis_commands
from shared.redis_commands import reply_text

log = logging.getLogger(__name__)
STEAL_EVERY_S = 0.25  # how often an idle worker looks at the other workers' streams

# KEYS: the placed set, then the dead worker's streams. ARGV: group, worker id. Returns 1 when it forgot them.
FORGET_SCRIPT = """
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[i])
    if not ok then
      if redis.call('XLEN', KEYS[i]) > 0 then return 0 end
    else
      local found = false
      for _, g in ipairs(groups) do
        local f = {}
        for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
        if f['name'] == ARGV[1] then
          found = true
          if tonumber(f['pending']) > 0 then return 0 end
          if #redis.call('XRANGE', KEYS[i], '(' .. f['last-delivered-id'], '+', 'COUNT', 1) > 0 then return 0 end
        end
      end
      if not found and redis.call('XLEN', KEYS[i]) > 0 then return 0 end
    end
  end
end
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('SREM', KEYS[1], ARGV[2])
return 1
"""


def placed_members(redis: Any, model: str) -> list[str]:
    """Every worker id with per-worker streams of the model, sorted."""
    return sorted(reply_text(m) for m in redis.smembers(keys.placed_workers(model)))


def member_states(redis: Any, members: list[str]) -> dict[str, str]:
    """Each member's registry state: "ready", "draining", or "" (no registry entry: dead)."""
    pipe = redis.pipeline(transaction=False)
    for member in members:
        pipe.hget(keys.worker_key(member), "state")
    return {m: reply_text(state) if state is not None else "" for m, state in zip(members, pipe.execute(), strict=True)}


def ensure_group(redis: Any, stream: str) -> None:
    """Create a stream's consumer group (and the stream) where missing; entries already there stay readable."""
    redis_commands.run(redis, redis_commands.create_group(stream))


def overdue(redis: Any, stream: str, *, count: int, older_than_ms: int, now_ms: int) -> int:
    """How many of the (up to `count`) oldest jobs not yet read from `stream` have waited past `older_than_ms`."""
    try:
        groups = redis.xinfo_groups(stream)
    except ResponseError:
        return 0  # no stream yet
    group = next((g for g in groups if reply_text(g.get("name")) == keys.JOBS_GROUP), None)
    if group is None:
        return 0
    entries = redis.xrange(stream, min="(" + reply_text(group["last-delivered-id"]), max="+", count=count)
    return sum(1 for entry_id, _fields in entries if int(reply_text(entry_id).split("-")[0]) <= now_ms - older_than_ms)


def redis_now_ms(redis: Any) -> int:
    """Redis's clock in ms (stream entry ids carry it; the worker's clock may differ)."""
    seconds, micros = redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def plan_others(redis: Any, model: str, worker_id: str, *, free: int,
                steal_after_s: float) -> dict[str, list[tuple[str, int]]]:
    """Per priority class, the other workers' streams to read now and how many jobs from each (at most `free`):
    a dead or draining worker's at once, a live one's only those overdue."""
    members = [m for m in placed_members(redis, model) if m != worker_id]
    plan: dict[str, list[tuple[str, int]]] = {}
    if not members or free <= 0:
        return plan
    states = member_states(redis, members)
    now_ms = redis_now_ms(redis)
    for priority in keys.PRIORITY_ORDER:
        for member in members:
            stream = keys.worker_jobs_stream(model, member, priority)
            if states[member] == "ready":
                count = overdue(redis, stream, count=free, older_than_ms=int(steal_after_s * 1000), now_ms=now_ms)
            else:
                ensure_group(redis, stream)  # a gateway may have placed on it after Redis lost the group
                count = free
            if count > 0:
                plan.setdefault(priority, []).append((stream, count))
    return plan


def forget_dead(redis: Any, model: str, worker_id: str) -> list[str]:
    """Delete the streams of dead members that hold nothing and drop them from the set; returns those forgotten."""
    members = [m for m in placed_members(redis, model) if m != worker_id]
    states = member_states(redis, members) if members else {}
    forgotten = []
    for member in (m for m in members if not states[m]):
        args = [FORGET_SCRIPT, 1 + len(keys.PRIORITY_ORDER), keys.placed_workers(model),
                *keys.worker_jobs_streams(model, member), keys.JOBS_GROUP, member]
        if redis.eval(*args):
            forgotten.append(member)
            log.info("forgot dead worker %s's empty job streams", member)
    return forgotten


def reclaim_streams(redis: Any, model: str) -> list[str]:
    """Every job stream of the model to look for stalled entries in: shared and per-worker, by priority class."""
    members = placed_members(redis, model)
    return [stream for priority in keys.PRIORITY_ORDER
            for stream in [keys.jobs_stream(model, priority)] + [keys.worker_jobs_stream(model, m, priority)
                                                                 for m in members]]


class Stealer:
    """Rate-limits the look at other workers' streams (idle worker) and the clean-up of dead ones."""

    def __init__(self, redis: Any, model: str, worker_id: str, *, steal_after_s: float) -> None:
        self.redis = redis
        self.model = model
        self.worker_id = worker_id
        self.steal_after_s = steal_after_s
        self._last = 0.0

    def due(self) -> bool:
        """Whether it is time for another look (at most every STEAL_EVERY_S)."""
        return time.monotonic() - self._last >= STEAL_EVERY_S

    def plan(self, free: int) -> dict[str, list[tuple[str, int]]]:
        """The other workers' streams to read from now, per priority class (see plan_others)."""
        self._last = time.monotonic()
        return plan_others(self.redis, self.model, self.worker_id, free=free, steal_after_s=self.steal_after_s)

    def forget_dead(self) -> None:
        """Forget dead workers whose streams are empty (see forget_dead)."""
        forget_dead(self.redis, self.model, self.worker_id)
