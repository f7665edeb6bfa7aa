"""A stand-in engine for gateway relay benchmarks: a live worker that streams numbered tokens at a fixed rate.

It registers exactly as worker/serve/heartbeat.py does (registry hash with EXPIRE, llmfleet:workers and
llmfleet:models sorted sets, lease renewal by XCLAIM), takes jobs from its per-worker stream (where placement
puts them) and the model's shared stream with XREADGROUP, releasing the fair queue into the shared stream first
(group shared.keys.JOBS_GROUP, created with MKSTREAM when missing), and every 1/rate seconds emits one
TokenEvent per choice of every held job, all of them journaled and published in ONE MULTI/EXEC per tick
(as worker/serve/publisher.py does). After max_tokens tokens a job ends with ChoiceEnd + Done and is XACKed.
Each token's text is "<k>@<unix time of the tick's publish> " so a client can check order and latency.
The load client that drives a gateway in front of it is bench/relay_client.py.
Run: python bench/standin_worker.py --redis-url redis://127.0.0.1:PORT/0 [--model standin] [--rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

# this tree's packages, not an installed (or editable-installed other checkout's) llmfleet: the gateway it serves
# runs from this tree (`python -m` from its root), and both must spell the keys alike
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared import codec, keys  # noqa: E402
from shared.errors import InvalidRequest  # noqa: E402
from shared.fair_queue import release_fair  # noqa: E402
from shared.messages import (  # noqa: E402
    CancelRequest,
    ChoiceEndEvent,
    DoneEvent,
    GenerateJob,
    TokenEvent,
    Usage,
)
from shared.redis_commands import create_group, queue_event, queue_job_done, run_async  # noqa: E402
from shared.registry import RegistryEntry  # noqa: E402
from worker.wire_commands import queue_deregistration, queue_registration  # noqa: E402

log = logging.getLogger("standin")
DEFAULT_MAX_TOKENS = 16
INTAKE_BLOCK_MS = 100
INTAKE_BATCH = 500
STREAM_MAXLEN = 10_000  # the shared stream's cap when releasing the fair queue into it


@dataclass
class HeldStream:
    """One job this stand-in holds: how far it got, and whether it was cancelled."""

    job_id: str
    message_id: bytes
    stream: str  # the job stream it came from (its per-worker stream or the shared one)
    n: int
    max_tokens: int
    prompt_tokens: int
    seq: int = 0
    sent: int = 0  # tokens emitted per choice
    cancelled: bool = False


@dataclass
class TickStats:
    """What the ticker did: for the relay report (the stand-in's own share of the latency)."""

    ticks: int = 0
    late_ticks: int = 0
    events: int = 0
    jobs: int = 0
    max_active: int = 0
    build_s: list[float] = field(default_factory=list)
    execute_s: list[float] = field(default_factory=list)


class StandinWorker:
    """The stand-in: heartbeat, intake, cancel listener and the fixed-rate ticker, all on one event loop."""

    def __init__(self, redis: Redis, *, model: str, rate: float, slots: int, heartbeat_s: float = 2.0,
                 ttl_s: float = 10.0, journal_ttl_s: int = 660) -> None:
        self.redis = redis
        self.model = model
        self.period = 1.0 / rate
        self.slots = slots
        self.heartbeat_s = heartbeat_s
        self.ttl_s = ttl_s
        self.journal_ttl_s = journal_ttl_s
        self.worker_id = f"{model}-standin-{uuid.uuid4().hex[:8]}"
        self.stream = keys.jobs_stream(model)
        self.placed_stream = keys.worker_jobs_stream(model, self.worker_id)  # where placement puts its jobs
        self.started = time.time()
        self.held: dict[str, HeldStream] = {}
        self.stats = TickStats()
        self.stop = asyncio.Event()

    async def run(self) -> TickStats:
        """Register, serve until stop is set, then deregister."""
        await run_async(self.redis, create_group(self.stream))
        await run_async(self.redis, create_group(self.placed_stream))
        await self.redis.sadd(keys.placed_workers(self.model), self.worker_id)
        await self.beat()
        tasks = [asyncio.create_task(coro) for coro in
                 (self._heartbeat_loop(), self._intake_loop(), self._cancel_loop(), self._tick_loop())]
        try:
            await self.stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            pipe = self.redis.pipeline(transaction=True)
            queue_deregistration(pipe, self.worker_id)
            await pipe.execute()
        return self.stats

    async def beat(self) -> None:
        """Write the registry entry (as worker/serve/heartbeat.py does) and renew the lease of every held job."""
        pipe = self.redis.pipeline(transaction=True)
        entry = RegistryEntry(worker_id=self.worker_id, model=self.model, slots=self.slots, heartbeat=time.time(),
                              started=self.started, load=len(self.held), served=self.stats.jobs)
        queue_registration(pipe, entry, ttl_s=self.ttl_s)
        await pipe.execute()
        for stream in (self.placed_stream, self.stream):
            held = [h.message_id for h in self.held.values() if h.stream == stream]
            for start in range(0, len(held), 500):
                await self.redis.xclaim(stream, keys.JOBS_GROUP, self.worker_id, 0, held[start:start + 500],
                                        justid=True)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.beat()
            except RedisError as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _intake_loop(self) -> None:
        while True:
            free = self.slots - len(self.held)
            if free <= 0:
                await asyncio.sleep(0.05)
                continue
            try:  # the fair queue's jobs into the shared stream as far as there is room, as a real worker does
                await run_async(self.redis, release_fair(self.model, {"normal": free}, maxlen=STREAM_MAXLEN))
                reply = await self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, {self.placed_stream: ">", self.stream: ">"},
                                                    count=min(free, INTAKE_BATCH), block=INTAKE_BLOCK_MS)
            except RedisError as exc:
                log.warning("intake failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            for stream, messages in reply or []:
                for message_id, fields in messages:
                    await self._accept(stream.decode() if isinstance(stream, bytes) else stream, message_id, fields)

    async def _accept(self, stream: str, message_id: bytes, fields: dict[bytes, bytes]) -> None:
        """Hold a generate job; anything else ends at once with an error event."""
        try:
            job = codec.decode_job(fields[keys.JOB_FIELD.encode()])
        except (codec.WireFormatError, KeyError):
            pipe = self.redis.pipeline(transaction=True)
            queue_job_done(pipe, stream, message_id)
            await pipe.execute()
            return
        if not isinstance(job, GenerateJob):
            data = codec.encode_event(InvalidRequest("the stand-in engine only generates").to_event(job.id, 0))
            pipe = self.redis.pipeline(transaction=True)
            queue_event(pipe, self.model, job.id, 0, data, journal_ttl_s=self.journal_ttl_s, refresh_ttl=True)
            queue_job_done(pipe, stream, message_id)
            await pipe.execute()
            return
        prompt_tokens = len(job.prompt_token_ids or []) or len((job.prompt or "").split()) or 1
        max_tokens = DEFAULT_MAX_TOKENS if job.max_tokens is None else job.max_tokens
        self.held[job.id] = HeldStream(job.id, message_id, stream, job.n, max_tokens, prompt_tokens)
        self.stats.jobs += 1
        self.stats.max_active = max(self.stats.max_active, len(self.held))

    async def _cancel_loop(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(keys.cancel_channel(self.model))
        try:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None:
                    continue
                try:
                    notice = codec.decode(message["data"])
                except codec.WireFormatError:
                    continue
                if isinstance(notice, CancelRequest) and notice.id in self.held:
                    self.held[notice.id].cancelled = True
        finally:
            await pubsub.aclose()

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            delay = next_tick - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -self.period:
                self.stats.late_ticks += 1
                next_tick = loop.time()  # fell behind a whole period: do not burst to catch up
            next_tick += self.period
            if self.held:
                try:
                    await self._tick()
                except RedisError as exc:
                    log.warning("tick failed: %s", exc)

    async def _tick(self) -> None:
        """One token for every choice of every held job, journaled and published in one MULTI/EXEC."""
        stamp = time.time()
        text_tail = f"@{stamp:.6f} "
        pipe = self.redis.pipeline(transaction=True)
        finished: list[HeldStream] = []
        events = 0
        for held in list(self.held.values()):
            if held.sent < held.max_tokens and not held.cancelled:
                for index in range(held.n):
                    data = codec.encode_event(TokenEvent(id=held.job_id, seq=held.seq, index=index,
                                                         text=f"{held.sent}{text_tail}",
                                                         token_ids=[1 + held.sent % 1000]))
                    queue_event(pipe, self.model, held.job_id, held.seq, data, journal_ttl_s=self.journal_ttl_s,
                                refresh_ttl=held.seq == 0)
                    held.seq += 1
                    events += 1
                held.sent += 1
            if held.sent >= held.max_tokens or held.cancelled:
                events += self._finish(pipe, held)
                finished.append(held)
        for held in finished:
            del self.held[held.job_id]
        built = time.time()
        await pipe.execute()
        self.stats.ticks += 1
        self.stats.events += events
        self.stats.build_s.append(built - stamp)
        self.stats.execute_s.append(time.time() - built)

    def _finish(self, pipe: Pipeline, held: HeldStream) -> int:
        """Queue ChoiceEnd per choice, the Done event, and the ack; returns the number of events."""
        reason = "cancelled" if held.cancelled else "length"
        for index in range(held.n):
            end = ChoiceEndEvent(id=held.job_id, seq=held.seq, index=index, finish_reason=reason)
            queue_event(pipe, self.model, held.job_id, held.seq, codec.encode_event(end),
                        journal_ttl_s=self.journal_ttl_s, refresh_ttl=held.seq == 0)
            held.seq += 1
        completion = held.sent * held.n
        done = DoneEvent(id=held.job_id, seq=held.seq, usage=Usage(
            prompt_tokens=held.prompt_tokens, completion_tokens=completion, total_tokens=held.prompt_tokens + completion))
        queue_event(pipe, self.model, held.job_id, held.seq, codec.encode_event(done),
                    journal_ttl_s=self.journal_ttl_s, refresh_ttl=True)
        queue_job_done(pipe, held.stream, held.message_id)
        return held.n + 1


def stats_summary(stats: TickStats) -> dict[str, float]:
    """The tick statistics as plain numbers (milliseconds for durations)."""
    build, execute = percentiles(stats.build_s), percentiles(stats.execute_s)
    return {"ticks": stats.ticks, "late_ticks": stats.late_ticks, "events": stats.events, "jobs": stats.jobs,
            "max_active": stats.max_active, "build_ms_p50": 1000 * build["p50"], "build_ms_p99": 1000 * build["p99"],
            "execute_ms_p50": 1000 * execute["p50"], "execute_ms_p99": 1000 * execute["p99"]}


def percentiles(values: list[float] | array) -> dict[str, float]:
    """p50, p90, p99 and max of some values (nan when there are none)."""
    ordered = sorted(values) or [float("nan")]
    return {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))}


async def amain(args: argparse.Namespace) -> None:
    """Serve until SIGTERM/SIGINT, then write the tick statistics as JSON."""
    redis = Redis.from_url(args.redis_url, socket_connect_timeout=5)
    worker = StandinWorker(redis, model=args.model, rate=args.rate, slots=args.slots,
                           heartbeat_s=args.heartbeat_s, ttl_s=args.ttl_s)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop.set)
    try:
        stats = await worker.run()
    finally:
        await redis.aclose()
    summary = json.dumps(stats_summary(stats))
    if args.stats_file:
        with open(args.stats_file, "w", encoding="utf-8") as out:
            out.write(summary)
    else:
        print(summary, flush=True)


def main() -> None:
    """Parse flags and run the stand-in."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--model", default="standin")
    parser.add_argument("--rate", type=float, default=20.0, help="tokens per second per stream")
    parser.add_argument("--slots", type=int, default=2000, help="jobs held at once")
    parser.add_argument("--heartbeat-s", type=float, default=2.0)
    parser.add_argument("--ttl-s", type=float, default=10.0)
    parser.add_argument("--stats-file", default=None, help="write the tick statistics here (else stdout)")
    args = parser.parse_args()
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
