"""Placement as one Redis script (gateway/cluster/placer.py, shared/placing.py) on a real redis-server: it chooses
as `choose` does from the loads it counts in Redis, two gateways placing one burst count each other's jobs, and
a Redis that lost its scripts (restarted) gets it loaded again."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.cluster.placement import TIER_SEP, Candidate, PrefixMap, choose
from gateway.cluster.placer import Placer, Plan
from shared import codec, keys
from shared.messages import GenerateJob
from shared.registry import RegistryEntry
from shared.settings import Settings

MODEL = "m"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _worker(worker_id: str, slots: int, tier: str = "") -> RegistryEntry:
    return RegistryEntry(worker_id=worker_id, model=MODEL, slots=slots, heartbeat=0.0, started=0.0, load=99,
                         kv_tier=tier)  # its heartbeat load: not counted


def _job(request_id: str) -> GenerateJob:
    return GenerateJob(id=request_id, model=MODEL, created=0, deadline=1, prompt="p")


async def _give(redis: Redis, worker_id: str, *, held: int, waiting: int, stream: str = "") -> None:
    """Put `held` jobs taken by the worker (from the shared stream, or `stream`) and `waiting` placed on its own
    stream and not taken."""
    stream = stream or keys.jobs_stream(MODEL)
    own = keys.worker_jobs_stream(MODEL, worker_id)
    for name in (stream, own):
        if not await redis.exists(name):
            await redis.xgroup_create(name, keys.JOBS_GROUP, id="0", mkstream=True)
    for _ in range(held):
        await redis.xadd(stream, {keys.JOB_FIELD: b"x"})
        await redis.xreadgroup(keys.JOBS_GROUP, worker_id, {stream: ">"}, count=1)
    for _ in range(waiting):
        await redis.xadd(own, {keys.JOB_FIELD: b"x"})


async def test_the_script_chooses_as_choose_does_from_the_loads_in_redis(redis_server: Any) -> None:
    rng = random.Random(7)
    redis = Redis.from_url(redis_server.url)
    placer = Placer(redis, dataclasses.replace(Settings(), placement_balance_abs=4), PrefixMap(redis, ttl_s=60))
    tiers = ["", "host-a:/t", "host-b:/t"]
    reasons: set[str] = set()
    for case in range(60):
        await redis.flushdb()
        workers, candidates = [], []
        for i in range(rng.randint(2, 4)):
            worker_id, slots = f"w{case}-{i}", rng.randint(1, 12)
            held, waiting = rng.randint(0, slots), rng.randint(0, 3)
            workers.append(_worker(worker_id, slots, rng.choice(tiers)))
            candidates.append(Candidate(worker_id, slots, held, waiting, workers[-1].kv_tier))
            await _give(redis, worker_id, held=held, waiting=waiting)
        chain = [f"h{d}" for d in range(rng.randint(0, 3))]
        owners = [rng.choice([None, *(w.worker_id for w in workers), f"gone{TIER_SEP}{rng.choice(tiers[1:])}"])
                  for _ in chain]
        expected = choose(candidates, chain, owners, balance_abs=4, request_id=f"r{case}")
        plan = Plan(chain, owners, workers, chain[0] if chain else f"r{case}")
        choice, entry_id = await placer.place(_job(f"r{case}"), plan, b"job")
        reasons.add(choice.reason)
        assert (choice.worker_id, choice.reason, choice.depth) == (
            expected.worker_id, expected.reason, expected.depth), (case, candidates, owners)
        if choice.worker_id:
            stream = keys.worker_jobs_stream(MODEL, choice.worker_id)
            assert await redis.xrange(stream, min=entry_id, max=entry_id)
            for digest in chain:
                assert (await redis.get(keys.prefix_owner(MODEL, digest))).decode().split(TIER_SEP)[0] == choice.worker_id
    assert reasons == {"short", "new", "hit", "tier", "balance", "full"}  # every branch was compared
    await redis.aclose()


async def test_two_gateways_placing_one_burst_fill_the_slots_once(redis_server: Any) -> None:
    clients = [Redis.from_url(redis_server.url) for _ in range(2)]
    placers = [Placer(client, Settings(), PrefixMap(client, ttl_s=60)) for client in clients]
    workers = [_worker("a", 16), _worker("b", 16)]
    await _give(clients[0], "a", held=0, waiting=0)
    await _give(clients[0], "b", held=0, waiting=0)

    async def place(i: int) -> str | None:
        job = _job(f"r{i}")
        choice, _entry = await placers[i % 2].place(job, Plan([], [], workers, job.id), codec.encode_job(job))
        return choice.worker_id

    chosen = await asyncio.gather(*(place(i) for i in range(40)))
    assert chosen.count("a") == chosen.count("b") == 16 and chosen.count(None) == 8  # full: the shared stream
    for client in clients:
        await client.aclose()


async def test_jobs_taken_over_from_a_gone_workers_stream_count(redis_server: Any) -> None:
    redis = Redis.from_url(redis_server.url)
    placer = Placer(redis, Settings(), PrefixMap(redis, ttl_s=60))
    workers = [_worker("a", 8), _worker("b", 8)]
    await _give(redis, "a", held=6, waiting=0, stream=keys.worker_jobs_stream(MODEL, "gone"))  # a took them over
    await _give(redis, "b", held=0, waiting=0)
    plan = await placer.plan(_job("r"), workers, others={"gone", "a"})
    assert isinstance(plan, Plan) and plan.others == ("gone",)
    chosen = [(await placer.place(_job(f"r{i}"), dataclasses.replace(plan, seed=f"r{i}"), b"job"))[0].worker_id
              for i in range(6)]
    assert chosen == ["b"] * 6  # 6 held by a, 0 by b: b catches up first
    await redis.aclose()


async def test_a_worker_that_finished_its_batch_counts_as_idle_at_once(redis_server: Any) -> None:
    redis = Redis.from_url(redis_server.url)
    placer = Placer(redis, Settings(), PrefixMap(redis, ttl_s=60))
    workers = [_worker("a", 16), _worker("b", 16)]  # both heartbeats still say load 99
    await _give(redis, "a", held=8, waiting=0)
    await _give(redis, "b", held=0, waiting=0)
    shared = keys.jobs_stream(MODEL)
    pending = await redis.xpending_range(shared, keys.JOBS_GROUP, min="-", max="+", count=100)
    done = [p["message_id"] for p in pending]
    await redis.xack(shared, keys.JOBS_GROUP, *done)  # a's batch ended (queue_job_done: XACK + XDEL)
    await redis.xdel(shared, *done)
    chosen = [(await placer.place(_job(f"r{i}"), Plan([], [], workers, f"r{i}"), b"job"))[0].worker_id
              for i in range(16)]
    assert chosen.count("a") == chosen.count("b") == 8
    await redis.execute_command("SCRIPT", "FLUSH")  # as after a restart: the script is loaded again
    assert (await placer.place(_job("after"), Plan([], [], workers, "after"), b"job"))[0].worker_id in ("a", "b")
    await redis.aclose()
