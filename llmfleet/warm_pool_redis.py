"""What a node agent reads and writes in Redis: the live workers, the queue depth of its models, the load
claim (exactly one node loads a model), remembered failures, the admin command stream and its own state."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from redis import Redis

from shared import codec, keys
from shared import warm_pool_commands as pool_wire
from shared.codec import WireFormatError
from shared.errors import ModelLoadFailed
from shared.fair_queue import release_fair
from shared.redis_commands import (
    create_group,
    fresh_workers,
    queue_event,
    queue_job_done,
    queue_states,
    run,
)
from shared.registry import RegistryEntry
from shared.warm_pool import NodeState

log = logging.getLogger(__name__)

FAIL_BATCH = 500
RELEASE_MAXLEN = 100_000  # the shared stream's approximate trim when a failed load releases its fair queues
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if tonumber(ARGV[2]) > 0 then return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True)
class QueueDepth:
    """A model's jobs waiting (not yet taken by a worker) and pending (taken, not yet finished)."""

    waiting: int = 0
    pending: int = 0
    held: tuple[tuple[str, int], ...] = ()  # (consumer = worker id, jobs it took and has not acked)

    @property
    def busy(self) -> bool:
        """Whether the model has queued or in-flight work."""
        return self.waiting > 0 or self.pending > 0

    def orphaned(self, registered: set[str]) -> int:
        """Jobs held by workers with no registry entry (stopped or dead as they read them): a worker of the model
        takes them over (worker/failover/takeover.py), so they are demand as much as waiting jobs are."""
        return sum(count for worker_id, count in self.held if worker_id not in registered)


def live_workers(redis: Redis, ttl_s: float, now: float) -> list[RegistryEntry]:
    """Every worker with a fresh registry entry (ready or draining)."""
    return run(redis, fresh_workers(now, ttl_s))


def queue_depths(redis: Redis, models: list[str]) -> dict[str, QueueDepth]:
    """Waiting and pending jobs of each model, over its shared and per-worker (placed) streams, every priority."""
    states = run(redis, queue_states(models))
    return {model: QueueDepth(state.waiting, state.in_flight, tuple(sorted(state.held.items())))
            for model, state in states.items()}


def claim_load(redis: Redis, model: str, node_id: str, ttl_s: float) -> bool:
    """Become the one node loading `model` (SET NX with a TTL); False when another node holds the claim."""
    return bool(redis.set(keys.pool_loading(model), node_id, nx=True, px=max(1, int(ttl_s * 1000))))


def release_load(redis: Redis, model: str, node_id: str, *, keep_s: float = 0.0) -> None:
    """Drop our claim on `model`, or (keep_s > 0) hold it keep_s more from now: renewing it while our load runs,
    or letting others see the new worker before they decide. Another node's claim is left alone."""
    redis.eval(RELEASE_SCRIPT, 1, keys.pool_loading(model), node_id, int(keep_s * 1000))


def remembered_failure(redis: Redis, model: str) -> str | None:
    """The message of `model`'s remembered load failure, if any."""
    return run(redis, pool_wire.remembered_failure(model))


def record_failure(redis: Redis, model: str, message: str, ttl_s: float) -> None:
    """Remember that `model` failed to load (gateways refuse its requests with this message until it expires)."""
    pipe = redis.pipeline(transaction=False)
    pool_wire.queue_failure(pipe, model, message, ttl_s)
    pipe.execute()


def fail_waiting(redis: Redis, model: str, node_id: str, message: str, *, retry_after: float, journal_ttl_s: int) -> int:
    """End every queued job of `model` with a ModelLoadFailed error (seq 0): take it as consumer `pool-<node>`,
    journal and publish the error, ack and delete the entry. Returns how many jobs were ended."""
    consumer, ended = f"pool-{node_id}", 0
    error = ModelLoadFailed(message, retry_after=retry_after)
    for _ in range(2):  # jobs still in a fair queue first go to their streams (a Redis without the script: round 2)
        run(redis, release_fair(model, dict.fromkeys(keys.PRIORITY_ORDER, FAIL_BATCH), maxlen=RELEASE_MAXLEN))
        ended += _fail_streams(redis, model, consumer, error, journal_ttl_s)
    if ended:
        log.info("ended %d waiting requests of %s with its load error", ended, model)
    return ended


def _fail_streams(redis: Redis, model: str, consumer: str, error: ModelLoadFailed, journal_ttl_s: int) -> int:
    """Take up to FAIL_BATCH jobs of each of the model's shared streams and end each with `error`; how many."""
    ended = 0
    for stream in keys.jobs_streams(model):
        run(redis, create_group(stream))  # whoever comes first creates it (a gateway usually did)
        replies = redis.xreadgroup(keys.JOBS_GROUP, consumer, {stream: ">"}, count=FAIL_BATCH)
        for _stream, entries in replies or []:
            pipe = redis.pipeline(transaction=True)
            for entry_id, fields in entries:
                try:
                    job = codec.decode_job(fields.get(keys.JOB_FIELD.encode(), b""))
                except WireFormatError:
                    job = None
                if job is not None:
                    queue_event(pipe, model, job.id, 0, codec.encode_event(error.to_event(job.id, 0)),
                                journal_ttl_s=journal_ttl_s, refresh_ttl=True)
                    ended += 1
                queue_job_done(pipe, stream, entry_id)
            pipe.execute()
    return ended


def last_command_id(redis: Redis) -> bytes:
    """The id of the newest admin command (a node starting now acts only on later ones)."""
    newest = redis.xrevrange(keys.POOL_COMMANDS, count=1)
    return newest[0][0] if newest else b"0-0"


def read_commands(redis: Redis, after: bytes) -> tuple[list[dict[str, str]], bytes]:
    """Admin commands after `after` (without blocking), and the id to read after next time."""
    replies = redis.xread({keys.POOL_COMMANDS: after}, count=100)
    commands = []
    for _stream, entries in replies or []:
        for entry_id, fields in entries:
            after = entry_id
            commands.append({k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()})
    return commands, after


def add_command(redis: Redis, op: str, model: str, *, force: bool = False) -> None:
    """Queue an admin command for the node agents (load / unload); a load forgets a remembered failure, as the
    gateway's does (shared/warm_pool_commands.py)."""
    run(redis, pool_wire.send_command(op, model, force=force))


def usage(redis: Redis) -> tuple[dict[str, float], dict[str, float]]:
    """Each model's last use by a gateway (unix s) and the keep-alive of its latest request (s; -1 = forever)."""
    return run(redis, pool_wire.usage())


def publish_state(redis: Redis, state: NodeState) -> None:
    """Write the node's state hash (with its TTL) and its score in the nodes index."""
    pipe = redis.pipeline(transaction=False)  # the hash and the index are in two slots; every beat writes both
    pool_wire.queue_node_state(pipe, state)
    pipe.execute()


def remove_state(redis: Redis, node_id: str) -> None:
    """Remove the node's state (clean shutdown)."""
    pipe = redis.pipeline(transaction=False)  # two slots; an index entry left over is forgotten by its age
    pool_wire.queue_node_removal(pipe, node_id)
    pipe.execute()
