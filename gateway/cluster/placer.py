"""The gateway's side of placement: what the choice needs (the prefix chain, its owners, the live workers), and
the script that counts, chooses and writes in one step (shared/placing.py PLACE_SCRIPT).

A job is placed where every gateway sees it the moment it is placed: the script counts each worker's jobs from
Redis itself (waiting on its own streams, held on any of the model's streams), so two gateways placing one
burst count each other's jobs, and a burst sent the moment a batch ended counts what the workers hold then
(not what their last heartbeat said). Nothing is reserved apart from the job, so nothing outlives a gateway
killed mid-burst. `choose` (gateway/cluster/placement.py) is the same rule in Python, for reading and testing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.cluster.placement import (
    BALANCE_REL,
    TIER_SEP,
    Choice,
    PrefixMap,
    placeable,
    prefix_chain,
    prompt_text,
    rendezvous,
)
from shared import keys
from shared.messages import Job
from shared.placing import PLACE_SCRIPT, Contender, Step, place_args, placed
from shared.registry import RegistryEntry
from shared.settings import Settings


@dataclass(frozen=True)
class Plan:
    """What the script chooses from: the job's prefix chain, who last got each prefix, the live workers."""

    chain: list[str]
    owners: list[str | None]
    workers: list[RegistryEntry]
    seed: str  # rendezvous seed of ties: the chain's first hash, or the request id for a prompt with none
    others: tuple[str, ...] = ()  # other workers whose own streams' pending entries count (gone ones' taken over)


def contenders_of(workers: Sequence[RegistryEntry], seed: str) -> list[Contender]:
    """The workers as the script sees them, each with its tie-break rank (rendezvous hash order on `seed`)."""
    order = sorted(workers, key=lambda w: rendezvous(w.worker_id, seed))
    rank = {w.worker_id: i for i, w in enumerate(order)}
    return [Contender(w.worker_id, w.slots, w.kv_tier, rank[w.worker_id]) for w in workers]


def steps_of(workers: Sequence[RegistryEntry], owners: Sequence[str | None]) -> list[Step]:
    """The prefix chain's steps, deepest first (choose()'s loop): its owner when live, then its host KV tier
    (the live owner's, or the one the prefix map recorded with a gone owner)."""
    by_id = {w.worker_id: w for w in workers}
    steps: list[Step] = []
    for depth in range(len(owners), 0, -1):
        owner, _, tier = (owners[depth - 1] or "").partition(TIER_SEP)
        worker = by_id.get(owner) if owner else None
        if worker is not None:
            steps.append(Step("hit", worker.worker_id, depth))
            tier = worker.kv_tier
        if tier:
            steps.append(Step("tier", tier, depth))
    return steps


class Placer:
    """Places generation jobs on workers' own streams through PLACE_SCRIPT."""

    def __init__(self, redis: Redis, settings: Settings, prefix_map: PrefixMap) -> None:
        self._settings = settings
        self._prefix_map = prefix_map
        self._script = redis.register_script(PLACE_SCRIPT)  # EVALSHA; loaded again after a Redis restart

    async def plan(self, job: Job, workers: list[RegistryEntry], others: Iterable[str] = ()) -> Plan | Choice:
        """What placing `job` needs, or the Choice when placement does not apply (off, or one worker); `others`:
        workers that are not candidates but may have placed streams (the jobs taken from them count)."""
        generation = placeable(job)
        if not self._settings.prefix_placement or generation is None:
            return Choice(None, "off")
        if len(workers) < 2:
            return Choice(None, "single")
        chain = prefix_chain(prompt_text(generation))
        owners = await self._prefix_map.owners(job.model, chain)
        live = {w.worker_id for w in workers}
        return Plan(chain, owners, workers, chain[0] if chain else job.id, tuple(sorted(set(others) - live)))

    async def place(self, job: Job, plan: Plan, payload: bytes) -> tuple[Choice, bytes]:
        """Choose and write in one script; (the choice, the entry id). A choice of no worker wrote nothing: the
        caller queues the job on the shared stream."""
        settings = self._settings
        script_keys, argv = place_args(
            job.model, job.priority, contenders_of(plan.workers, plan.seed), steps_of(plan.workers, plan.owners),
            [keys.prefix_owner(job.model, digest) for digest in plan.chain], payload, others=plan.others,
            maxlen=settings.stream_maxlen, prefix_ttl_ms=self._prefix_map.ttl_ms,
            balance_abs=settings.placement_balance_abs, balance_rel=BALANCE_REL, check_balance=bool(plan.chain),
            fallback="new" if plan.chain else "short")
        answer = placed(await self._script(keys=script_keys, args=argv))
        if not answer.worker_id:
            return Choice(None, "full"), b""
        tier = next((w.kv_tier for w in plan.workers if w.worker_id == answer.worker_id), "")
        return Choice(answer.worker_id, answer.reason, answer.depth, tier), answer.entry_id.encode()
