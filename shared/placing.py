"""Placement as one Redis script: count each candidate worker's load, choose, and write the job, in one step.

Every gateway places through this script, so every placement counts every earlier one, whichever gateway made
it, and nothing is reserved apart from the job itself: a worker's load is the jobs waiting on its own streams
(XLEN - pending: acked jobs are deleted) plus the jobs it holds (its pending entries on every counted stream:
taken, not acked, acked in the same script as the job's last event). Its heartbeat's load is not used: it lags
by up to an interval (and the gateway's registry cache), and a burst sent the moment a batch ended saw one worker
still busy with it and split 15/1. A gateway killed mid-burst leaves nothing behind but the jobs it wrote, which
are real work; a Redis restart keeps whatever streams it keeps, and the counts with them.

The choice is gateway/cluster/placement.py's `choose` (its Python twin, tested to agree): the imbalance guard
(least busy with room), then each step of the prefix chain deepest first (the owner if it has room, else the
least busy with room on the owner's host KV tier), then the least busy with room (ties: the lowest `rank`, a
rendezvous hash the gateway computes); nobody with room: nothing is written and the gateway queues the job on
the shared stream. The prefix map's entries are set to the chosen worker in the same step.

KEYS: each candidate's own streams (P each, in candidate order, class order), then other streams whose pending
entries count (the shared streams, and the own streams of workers that are not candidates), the prefix map keys of the chain, the placed-workers set.
ARGV: candidates, P, streams counted, prefix keys, the job's class index (1-based), group, maxlen, job field,
job bytes, prefix TTL (ms), balance abs, balance rel, check balance (1/0), fallback reason, steps; then per
candidate id, slots, tier, rank; then per step kind ("hit" or "tier"), target (worker id or tier), depth.
Returns {worker id or "", reason, depth, entry id or ""}.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from shared import keys

PLACE_SCRIPT = """
local n, P, S, m = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local class, group = tonumber(ARGV[5]), ARGV[6]
local held, waiting = {}, {}
for i = 1, S do
  local length = redis.call('XLEN', KEYS[i])
  local pending = 0
  if length > 0 then
    local ok, summary = pcall(redis.call, 'XPENDING', KEYS[i], group)
    if ok then
      pending = tonumber(summary[1])
      for _, consumer in ipairs(summary[4] or {}) do
        held[consumer[1]] = (held[consumer[1]] or 0) + tonumber(consumer[2])
      end
    end
  end
  if i <= n * P then
    local c = math.floor((i - 1) / P) + 1
    waiting[c] = (waiting[c] or 0) + math.max(0, length - pending)
  end
end
local ids, slots, tiers, ranks, busy = {}, {}, {}, {}, {}
for c = 1, n do
  local o = 15 + (c - 1) * 4
  ids[c], slots[c], tiers[c], ranks[c] = ARGV[o + 1], tonumber(ARGV[o + 2]), ARGV[o + 3], tonumber(ARGV[o + 4])
  busy[c] = (held[ids[c]] or 0) + (waiting[c] or 0)
end
local function least(tier)
  local best = nil
  for c = 1, n do
    if busy[c] < slots[c] and (tier == nil or tiers[c] == tier) then
      if best == nil or busy[c] < busy[best] or (busy[c] == busy[best] and ranks[c] < ranks[best]) then best = c end
    end
  end
  return best
end
local chosen, reason, depth = nil, ARGV[14], 0
local lo, hi = math.huge, -math.huge
for c = 1, n do lo, hi = math.min(lo, busy[c]), math.max(hi, busy[c]) end
if ARGV[13] == '1' and hi - lo > tonumber(ARGV[11]) and hi > tonumber(ARGV[12]) * lo then
  chosen, reason = least(nil), 'balance'
else
  local o = 15 + n * 4
  for s = 1, tonumber(ARGV[15]) do
    local kind, target, d = ARGV[o + 1], ARGV[o + 2], tonumber(ARGV[o + 3])
    if kind == 'hit' then
      for c = 1, n do
        if ids[c] == target and busy[c] < slots[c] then chosen, reason, depth = c, 'hit', d end
      end
    else
      local mate = least(target)
      if mate ~= nil then chosen, reason, depth = mate, 'tier', d end
    end
    if chosen ~= nil then break end
    o = o + 3
  end
  if chosen == nil then chosen = least(nil) end
end
if chosen == nil then return {'', 'full', 0, ''} end
redis.call('SADD', KEYS[S + m + 1], ids[chosen])
local value = ids[chosen]
if tiers[chosen] ~= '' then value = value .. '\\31' .. tiers[chosen] end
for i = 1, m do redis.call('SET', KEYS[S + i], value, 'PX', ARGV[10]) end
local entry = redis.call('XADD', KEYS[(chosen - 1) * P + class], 'MAXLEN', '~', ARGV[7], '*', ARGV[8], ARGV[9])
return {ids[chosen], reason, depth, entry}
"""


class Contender(NamedTuple):
    """A live worker the script may place on: its id, slots, host KV tier ("" = none) and tie-break rank."""

    worker_id: str
    slots: int
    tier: str
    rank: int


class Step(NamedTuple):
    """One step of the prefix chain, deepest first: "hit" (the owner, if it has room) or "tier" (the least busy
    worker with room on that host KV tier), and the chain depth it stands for."""

    kind: str
    target: str
    depth: int


class Placed(NamedTuple):
    """The script's answer: the worker the job was written for ("" = none had room, nothing written), why, the
    prefix depth it had, and the job's stream entry id."""

    worker_id: str
    reason: str
    depth: int
    entry_id: str


def place_args(model: str, priority: str, contenders: Sequence[Contender], steps: Sequence[Step],
               prefix_keys: Sequence[str], job: bytes, *, others: Sequence[str] = (), maxlen: int,
               prefix_ttl_ms: int, balance_abs: int, balance_rel: float, check_balance: bool,
               fallback: str) -> tuple[list[str], list[Any]]:
    """(KEYS, ARGV) of PLACE_SCRIPT for one job of `model` in class `priority` (see the module docstring); the
    own streams of `others` (workers that are not candidates: gone ones) count for the jobs taken from them."""
    classes = list(keys.PRIORITY_ORDER)
    own = [s for c in contenders for s in keys.worker_jobs_streams(model, c.worker_id)]
    counted = [*own, *keys.jobs_streams(model), *(s for w in others for s in keys.worker_jobs_streams(model, w))]
    script_keys = [*counted, *prefix_keys, keys.placed_workers(model)]
    argv: list[Any] = [len(contenders), len(classes), len(counted), len(prefix_keys), classes.index(priority) + 1,
                       keys.JOBS_GROUP, maxlen, keys.JOB_FIELD, job, prefix_ttl_ms, balance_abs, balance_rel,
                       1 if check_balance else 0, fallback, len(steps)]
    for contender in contenders:
        argv += [contender.worker_id, contender.slots, contender.tier, contender.rank]
    for step in steps:
        argv += [step.kind, step.target, step.depth]
    return script_keys, argv


def placed(reply: Sequence[Any]) -> Placed:
    """The script's reply, decoded."""
    worker_id, reason, depth, entry = (v.decode() if isinstance(v, bytes) else v for v in reply)
    return Placed(str(worker_id), str(reason), int(depth), str(entry))
