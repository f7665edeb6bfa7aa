"""Job ownership with epochs, so a worker that stalled past its lease cannot write into a stream that
another worker now owns.

`llmfleet:{model}:owner:{request_id}` = "<epoch>:<worker_id>" is set by TAKE_SCRIPT each time a worker takes a job
(its first delivery or a takeover); the epoch counts the takings of that request (1, 2, ...). TAKE grants
ownership only to the consumer that holds the job's entry in the group's pending list at that moment, and
returns the entry's delivery count and the previous owner. The epoch, not the delivery count, is what the poison-job
check counts: a taking whose SET Redis refused (OOM) wrote nothing, though its read or claim counted a delivery.

Every journal-append + publish (+ the final ack) of a request is one PUBLISH_SCRIPT call, which writes
nothing unless the owner value is still the writer's: a stale writer is refused (the script returns the
current owner) and drops the job. The ack turns the value into "done", so a writer that wakes after the
end is refused too. The heartbeat renews leases with RENEW_SCRIPT, which XCLAIMs only the entries the
worker still owns and names the others. A missing owner key (Redis restarted empty: the job stream went
with it, so nobody can have taken the job over) lets the holder go on and sets the key again.
Scripts run with EVALSHA; NOSCRIPT (a restarted Redis forgot them) loads them and tries again. Every script's keys
carry the request's model hash tag (shared/keys.py), so each call stays in one Redis Cluster slot; pipelines send
EVALSHA through execute_command (redis-py's cluster pipeline refuses its evalsha(), though it routes the command by
its keys), and SCRIPT LOAD on a cluster client reaches every primary.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from shared import keys
from shared.redis_commands import JOURNAL_MAXLEN, reply_text, sharded

DONE = "done"  # the owner value once a request's terminal event and ack are written

# KEYS: owner, jobs stream. ARGV: group, consumer, entry id, ttl s.
# Returns {owner value | 'lost' | 'done', previous owner or '', times delivered}.
TAKE_SCRIPT = """
local pending = redis.call('XPENDING', KEYS[2], ARGV[1], ARGV[3], ARGV[3], 1)
local entry = pending[1]
if not entry or entry[2] ~= ARGV[2] then return {'lost', '', 0} end
local previous = redis.call('GET', KEYS[1])
if previous == 'done' then return {'done', 'done', entry[4]} end
local epoch = 1
if previous then epoch = (tonumber(string.match(previous, '^(%d+):')) or 0) + 1 end
local owner = epoch .. ':' .. ARGV[2]
redis.call('SET', KEYS[1], owner, 'EX', ARGV[4])
return {owner, previous or '', entry[4]}
"""

# KEYS: owner, journal, events channel, jobs stream.
# ARGV: owner value, ttl s, journal maxlen, refresh ttl ('1'/'0'), entry id to ack ('' = none), group,
# then seq, event bytes for each event. Returns 1, or the current owner value when the writer is stale.
PUBLISH_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return current end
for i = 7, #ARGV, 2 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'seq', ARGV[i], 'event', ARGV[i + 1])
end
if #ARGV > 6 and ARGV[4] == '1' then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
for i = 8, #ARGV, 2 do redis.call('PUBLISH', KEYS[3], ARGV[i]) end
if ARGV[5] ~= '' then
  redis.pcall('XACK', KEYS[4], ARGV[6], ARGV[5])
  redis.pcall('XDEL', KEYS[4], ARGV[5])
  redis.call('SET', KEYS[1], 'done', 'EX', ARGV[2])
elseif not current then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
end
return 1
"""

# KEYS: jobs stream, then one owner key per held job. ARGV: group, consumer, then entry id, owner value per
# job. XCLAIMs (JUSTID: the delivery count stays) the entries still owned; returns the entry ids that are not.
RENEW_SCRIPT = """
local lost = {}
for i = 2, #KEYS do
  local current = redis.call('GET', KEYS[i])
  if current and current ~= ARGV[2 * i] then
    table.insert(lost, ARGV[2 * i - 1])
  else
    redis.pcall('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[2 * i - 1], 'JUSTID')
  end
end
return lost
"""

# the same on a Redis Cluster: sharded pub/sub (Redis 7), the events channel being KEYS[3], in the script's slot
SPUBLISH_SCRIPT = PUBLISH_SCRIPT.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")

_SCRIPTS = {hashlib.sha1(s.encode()).hexdigest(): s for s in (TAKE_SCRIPT, PUBLISH_SCRIPT, RENEW_SCRIPT)}
TAKE_SHA, PUBLISH_SHA, RENEW_SHA = _SCRIPTS
SPUBLISH_SHA = hashlib.sha1(SPUBLISH_SCRIPT.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    """The outcome of taking one job: owned (with an owner value), already done, or lost to another consumer."""

    status: str  # "owner", "done" or "lost"
    owner: str = ""  # "<epoch>:<worker_id>" when status is "owner"
    previous: str = ""  # the owner value before this taking ("" = none: a first taking)
    deliveries: int = 0  # times the entry has been read or claimed, this one included (refused takings too)

    @property
    def epoch(self) -> int:  # the takings of the request so far, this one included: the poison check's count
        """The epoch of this taking (0 unless owned)."""
        return int(self.owner.split(":", 1)[0]) if self.status == "owner" else 0


@dataclass(frozen=True)
class Lease:
    """A held job as the heartbeat renews it: its stream entry, its request and the owner value it holds."""

    entry_id: str
    request_id: str
    owner: str
    stream: str  # the job stream (priority class) the entry is in


def is_noscript(error: object) -> bool:
    """Whether a reply or exception is NOSCRIPT (Redis does not know a script's SHA: load it, try again)."""
    return isinstance(error, NoScriptError) or (isinstance(error, ResponseError) and "NOSCRIPT" in str(error))


def load_scripts(redis: Any) -> None:
    """SCRIPT LOAD every fencing script (on a Redis Cluster: on every primary, the sharded PUBLISH among them)."""
    for script in (*_SCRIPTS.values(), *((SPUBLISH_SCRIPT,) if sharded(redis) else ())):
        redis.script_load(script)


def take_ownership(redis: Any, stream: str, worker_id: str, model: str, takings: list[tuple[str, str]], *,
                   ttl_s: int) -> list[Grant]:
    """Take each (request id, entry id) of a job of `model` (the stream's) with a new owner epoch, in one round
    trip; one Grant per taking."""
    if not takings:
        return []

    def attempt() -> list[Any]:
        pipe = redis.pipeline(transaction=False)
        for request_id, entry_id in takings:
            pipe.execute_command("EVALSHA", TAKE_SHA, 2, keys.owner_key(model, request_id), stream, keys.JOBS_GROUP, worker_id, entry_id,
                         max(1, int(ttl_s)))
        return pipe.execute(raise_on_error=False)

    results = attempt()
    if any(is_noscript(r) for r in results):
        load_scripts(redis)
        results = attempt()  # a taking that had gone through just gets the next epoch: still ours
    for result in results:
        if isinstance(result, Exception):
            raise result  # e.g. NOGROUP: the caller's loop recreates the group
    grants = []
    for value, previous, deliveries in results:
        status = reply_text(value)
        if status in ("lost", DONE):
            grants.append(Grant(status, previous=reply_text(previous), deliveries=int(deliveries)))
        else:
            grants.append(Grant("owner", status, reply_text(previous), int(deliveries)))
    return grants


def queue_fenced_publish(pipe: Any, model: str, request_id: str, owner: str, events: list[tuple[int, bytes]], *, ttl_s: int,
                         refresh_ttl: bool, stream: str, ack_id: str | None) -> None:
    """Queue one request's events (journal, then publish) and its ack, all refused unless `owner` owns it."""
    flat: list[Any] = []
    for seq, data in events:
        flat += [str(seq), data]
    pipe.execute_command("EVALSHA", SPUBLISH_SHA if sharded(pipe) else PUBLISH_SHA, 4, keys.owner_key(model, request_id),
                         keys.journal_stream(model, request_id), keys.events_channel(model, request_id), stream, owner,
                         max(1, int(ttl_s)), JOURNAL_MAXLEN, "1" if refresh_ttl else "0", ack_id or "", keys.JOBS_GROUP,
                         *flat)


def renew_leases(redis: Any, stream: str, worker_id: str, model: str, leases: list[Lease]) -> list[str]:
    """Renew the lease (XCLAIM JUSTID) of every held job still owned; returns the entry ids owned by another."""
    if not leases:
        return []
    args: list[Any] = [RENEW_SHA, 1 + len(leases), stream, *(keys.owner_key(model, lease.request_id) for lease in leases),
                       keys.JOBS_GROUP, worker_id]
    for lease in leases:
        args += [lease.entry_id, lease.owner]
    try:
        lost = redis.evalsha(*args)
    except NoScriptError:
        load_scripts(redis)
        lost = redis.evalsha(*args)
    return [reply_text(entry_id) for entry_id in lost]
