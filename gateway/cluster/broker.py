"""The gateway's Redis side: admit a job, queue it, follow its events, cancel it.

submit(job):
  1. the model must have a live worker, or be in a live node agent's catalogue (gateway/cluster/warm_pool.py: the
     queued job is what makes a node load it; a remembered load failure is a 503 model_load_failed), or be known
     (a worker served it within LLMFLEET_MODEL_MEMORY_S: the job is queued and its stream waits up to
     LLMFLEET_WORKER_WAIT_S for a worker, the queued job being what an autoscaler starts one for; 0 = a 503
     NoWorkerAvailable at once); else 404 ModelNotFound;
  2. its waiting jobs (the consumer group's lag) must be under LLMFLEET_QUEUE_LIMIT (else 429 QueueFull);
  3. subscribe to llmfleet:events:{id} and wait for Redis's confirmation;
  4. pick the stream (gateway/cluster/placement.py): with two or more live workers, a generation job goes to the
     worker that has its prompt prefix cached, or else the least busy one, on its stream
     llmfleet:{model}:jobs@w:{worker}@{priority}: one script counts every worker's jobs in Redis, chooses and
     writes the job (and refreshes the prefix map) in one step (gateway/cluster/placer.py); anything else, or
     with no worker that has room, on the shared llmfleet:{model}:jobs[@{priority}];
  5. XADD <stream> * job <bytes>   (approximately capped at LLMFLEET_STREAM_MAXLEN); a job for the shared stream
     goes through its class's fair queue instead, released into the stream in its tenant's turn
     (gateway/cluster/fair_share.py).
The returned EventStream (gateway/cluster/event_stream.py) yields the request's events in seq order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.cluster import admission
from gateway.cluster.event_stream import EventStream, JobRef
from gateway.cluster.fair_share import queue_shared
from gateway.cluster.loras import resolve_job
from gateway.cluster.lost_jobs import QueuedEntry
from gateway.cluster.metrics import GatewayMetrics
from gateway.cluster.placement import Choice, PrefixMap
from gateway.cluster.placer import Placer, Plan
from gateway.cluster.queue_view import READ_EVERY_S, QueueState, QueueView, read_queue_state
from gateway.cluster.redis_health import RedisHealth
from gateway.cluster.registry import RECHECK_S, Registry
from gateway.cluster.sharded_subscriber import ClusterSubscriber, node_clients
from gateway.cluster.streams import Streams
from gateway.cluster.subscriber import QueueItem, Subscriber
from gateway.cluster.warm_pool import WarmPool
from gateway.http.error_log import ErrorLog
from gateway.http.rate_limit import RateLimiter
from gateway.http.redis_errors import redis_unavailable
from gateway.http.tracing import traced
from shared import codec, keys
from shared.errors import (
    ModelNotFound,
    NoWorkerAvailable,
    QueueFull,
    Unavailable,
)
from shared.messages import CancelRequest, GenerateJob, Job
from shared.redis_commands import publish, sharded, write_refusal
from shared.registry import RegistryEntry
from shared.settings import Settings

log = logging.getLogger(__name__)

CANCEL_MARKER_MARGIN_S = 60
CANCEL_WAIT_S = 5.0  # a cancel not written by then is given up (the job's deadline still ends it)


class Broker:
    """Queues jobs on Redis streams and follows their events over the shared pub/sub connection."""

    def __init__(self, redis: Redis, settings: Settings, registry: Registry, pool: WarmPool, *,
                 clock: Callable[[], float] = time.time, ping: Callable[[], object] | None = None) -> None:
        self.redis = redis
        self.settings = settings
        self.clock = clock
        self.health = RedisHealth(ping)  # `ping`: a blocking PING of the same Redis, for the health probe
        self._registry = registry  # admission reads them; routes read them from app.state (gateway/app.py)
        self._pool = pool
        self.metrics = GatewayMetrics()
        self.limiter = RateLimiter(redis)
        self.subscriber = _subscriber(redis, settings, retry_after_s=settings.retry_after_s,
                                      on_error=self.health.note_error,
                                      on_answer=self.health.note_answer)  # Redis answers: no "down" 503s after a pause
        self.health.on_recovered = self.subscriber.check_now  # a pub/sub connection that lived through it is suspect
        self.errors = ErrorLog(redis, retry_after_s=settings.retry_after_s)
        self._cancels: set[asyncio.Task[None]] = set()  # cancels of jobs whose write failed, under way
        self._admitting: dict[str, int] = {}  # model -> requests admitted by this gateway, not yet in its stream
        self._awaiting_worker: set[str] = set()  # request ids admitted with no live worker, until queued
        self.queue_view = QueueView(lambda model: self.queue_state(model),  # admission's shared, briefly reused read
                                    max_age_s=min(READ_EVERY_S, settings.registry_cache_s))
        self.placer = Placer(redis, settings, PrefixMap(redis, ttl_s=settings.prefix_ttl_s))
        self.streams = Streams(redis, settings, self.cancel, clock=clock)  # resumable streams' owners

    async def start(self) -> None:
        """Start the pub/sub dispatcher and the Redis health probe."""
        await self.subscriber.start()
        await self.health.start()
        await self.streams.start()

    async def close(self) -> None:
        """Stop the pub/sub dispatcher (after the error entries under way are written)."""
        await self.errors.flush()
        await self.streams.close()
        if self._cancels:  # each gives up by CANCEL_WAIT_S
            await asyncio.gather(*self._cancels, return_exceptions=True)
        await self.health.close()
        await self.subscriber.close()

    async def ping(self) -> bool:
        """True when Redis answers (the health probe is told at once)."""
        try:
            answered = bool(await self.redis.ping())
        except (RedisError, OSError):
            return False
        self.health.note_answer()
        return answered

    async def supervisor_status(self) -> dict[str, object] | None:
        """What `llmfleet serve` reports about the workers it supervises, when it runs this gateway."""
        if not self.settings.supervisor_key:
            return None
        try:
            raw = await self.redis.hgetall(self.settings.supervisor_key)
        except (RedisError, OSError):
            return None
        if not raw:
            return None
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        names = fields.get("workers_given_up", "")
        return {"workers_expected": int(fields.get("workers_expected", 0)),
                "workers_running": int(fields.get("workers_running", 0)),
                "workers_given_up": names.split(",") if names else [],
                "restarts": int(fields.get("restarts", 0))}

    async def submit(self, job: Job, *, keep_alive: float | None = None) -> EventStream:
        """Admit and queue `job`; returns the stream of its events (close it when done). `keep_alive` (seconds, -1
        forever) is how long the warm pool should keep the model after this request, when the request said."""
        job = traced(job)  # carries the request span's context (tracing on: gateway/http/tracing.py)
        job, workers = await self._admit_in_time(job, keep_alive)  # counted in self._admitting until it is in a stream
        try:
            return await self._queue(job, workers)
        except Unavailable:
            self.health.note_error()  # e.g. a refused write: the workers' heartbeats are refused too
            raise
        finally:
            self._admitting[job.model] -= 1
            self._awaiting_worker.discard(job.id)

    async def _admit_in_time(self, job: Job, keep_alive: float | None) -> tuple[Job, list[RegistryEntry]]:
        """_admit, but a fast 503 while Redis does not answer: at once when the health probe finds it down, or as
        soon as it does while admission waits on it (a paused Redis accepts connections and never replies)."""
        unreachable = Unavailable("the queue service (Redis) does not answer; please retry",
                                  retry_after=self.settings.retry_after_s)
        if self.health.down:
            raise unreachable
        if not self.health.probing:
            return await self._admit(job, keep_alive)
        admit = asyncio.ensure_future(self._admit(job, keep_alive))
        down = asyncio.ensure_future(self.health.wait_down())
        try:
            await asyncio.wait({admit, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            down.cancel()
            abandoned = not admit.done()
            if abandoned:
                admit.cancel()
                await asyncio.gather(admit, return_exceptions=True)
                if not admit.cancelled() and admit.exception() is None:  # admitted as it was cancelled: uncount it
                    self._admitting[job.model] -= 1
        if abandoned:
            self.health.note_error()
            raise unreachable
        try:
            return admit.result()
        except Unavailable:
            self.health.note_error()
            raise

    def registry_grace_s(self) -> float:
        """How long after a Redis failure an empty registry proves nothing: the workers' next heartbeat (they
        retry fast once Redis answers), the TTL of one written before a pause, and the registry cache."""
        return self.settings.heartbeat_ttl_s + self.settings.heartbeat_interval_s + self.settings.registry_cache_s + 1

    async def _queue(self, job: Job, workers: list[RegistryEntry]) -> EventStream:
        """Place the job (gateway/cluster/placer.py), write it to its stream and subscribe to its events."""
        with redis_unavailable(self.settings.retry_after_s):
            plan = await self.placer.plan(job, workers, self.queue_view.placed_workers(job.model))
        full = bool(workers) and all(w.load >= w.slots for w in workers)  # as their last heartbeats said
        queue, entry, choice = await self._write(job, plan, full=full)
        self.queue_view.note_queued(job.model, choice.worker_id)
        if isinstance(job, GenerateJob):
            self.metrics.placements.labels(job.model, choice.reason).inc()
        log.info("queued %s (placement %s%s)", job.describe(), choice.reason,
                 f" on {choice.worker_id}, depth {choice.depth}" if choice.worker_id else "")
        wait_until = None  # admitted with no live worker: its stream waits for one until then (not past its deadline)
        if job.id in self._awaiting_worker:
            wait_until = min(self.clock() + self.settings.worker_wait_s, job.deadline - 1.0)
        return EventStream(self, job, queue, worker_wait_until=wait_until, queued=entry)

    async def _write(self, job: Job, plan: Plan | Choice, *,
                     full: bool = False) -> tuple[asyncio.Queue[QueueItem], QueuedEntry, Choice]:
        """Subscribe to the job's events, then place it on a worker's stream (the script writes it), or else write
        it to its class's fair queue or shared stream; and where it went (checked after a Redis failover:
        lost_jobs.py) and why."""
        channel = keys.events_channel(job.model, job.id)
        queue = await self.subscriber.subscribe(channel)
        sent = False  # the write is on its way: from here, a failure leaves it unknown whether the job was written
        try:
            with redis_unavailable(self.settings.retry_after_s):
                stream, payload = keys.jobs_stream(job.model, job.priority), codec.encode_job(job)
                sent = True
                choice, entry_id = await self.placer.place(job, plan, payload) if isinstance(plan, Plan) else (plan, b"")
                direct = choice.worker_id is not None or not self.settings.fair_shares
                if choice.worker_id is not None:
                    stream = keys.worker_jobs_stream(job.model, choice.worker_id, job.priority)
                else:  # no worker had room (the script wrote nothing), or placement does not apply
                    entry_id = await self._write_shared(job, full=full)
        except BaseException as exc:
            # a refused write (OOM, READONLY, MISCONF) discarded the whole transaction: the job is not in a stream
            if sent and write_refusal(exc.__cause__ or exc) is None:  # cancelled (the client went away) or no
                # reply: the job may be in its stream; it must not run
                reason = "client_disconnected" if isinstance(exc, asyncio.CancelledError) else "not_queued"
                self._cancel_behind(job, reason)  # the 503 does not wait on it: its connection may be held too
            await self.subscriber.unsubscribe(channel)
            raise
        fair_queue = "" if direct else keys.fair_keys(job.model, job.priority)[0]  # (its script's reply: no entry id)
        entry = QueuedEntry(stream, entry_id if direct else b"", payload, self.settings.stream_maxlen, fair_queue,
                            "" if direct else keys.fair_lane_keys(job.model, job.priority)[1])
        return queue, entry, choice

    async def _write_shared(self, job: Job, *, full: bool = False) -> bytes:
        """Write the job to its class's shared stream, or through its fair queue (gateway/cluster/fair_share.py);
        `full`: every worker of the model was full at its last heartbeat (a newcomer's class is saturated)."""
        pipe = self.redis.pipeline(transaction=True)
        queue_shared(pipe, job, self.settings, self.clock(), full=full)
        return (await pipe.execute())[-1]

    async def follow(self, job: JobRef) -> EventStream:
        """The events of a job already queued, from its journal's first one, then live (a resumed stream)."""
        queue = await self.subscriber.subscribe(keys.events_channel(job.model, job.id))
        return EventStream.following(self, job, queue)

    async def cancel(self, request_id: str, model: str, reason: str, deadline: float) -> None:
        """Tell the workers to drop a request: mark it cancelled, then announce it. Never raises."""
        ttl = max(1, math.ceil(deadline - self.clock())) + CANCEL_MARKER_MARGIN_S
        notice = codec.encode(CancelRequest(id=request_id, model=model, reason=reason))
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(keys.cancelled_marker(model, request_id), b"1", ex=ttl)
            publish(pipe, keys.cancel_channel(model), notice)  # SPUBLISH on a Redis Cluster
            async with asyncio.timeout(CANCEL_WAIT_S):  # a connection a partition left silent: the reply ends late
                await pipe.execute()
        except (RedisError, OSError, TimeoutError, RuntimeError) as exc:  # RuntimeError: uvloop, a closed transport
            log.warning("could not publish cancel of %s (%s)", request_id, type(exc).__name__)
            return
        log.info("cancelled %s (%s)", request_id, reason)

    def _cancel_behind(self, job: Job, reason: str) -> None:
        """Cancel `job` in a task of its own (kept until done; close() waits for it), so the client's answer
        does not wait out a second command timeout."""
        task = asyncio.get_running_loop().create_task(self.cancel(job.id, job.model, reason, job.deadline))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _admit(self, job: Job, keep_alive: float | None) -> tuple[Job, list[RegistryEntry]]:
        """Refuse the job unless the model can take it now; returns it with its LoRA adapters resolved and the
        model's live workers."""
        model = job.model
        live = await self._registry.live_workers()
        if not any(w.model == model for w in live):  # none in the cached read: one that just registered counts
            live = await self._registry.live_workers(RECHECK_S)
        catalogued = model in await self._pool.catalogue()
        if catalogued:
            await self._pool.note_use(model, keep_alive)
        workers = [w for w in live if w.model == model]
        if not workers:
            return await self._admit_without_worker(job, catalogued, registry_empty=not live)
        if isinstance(job, GenerateJob):
            job = resolve_job(job, workers)  # an adapter no live worker has: 404 naming it
        admission.check_width(job, workers)
        state = await self.queue_view.state(model)
        waiting = state.waiting + self._admitting.get(model, 0)  # admitted here, not yet in the stream: a burst's own
        admission.decide(job, workers, waiting, state.in_flight, queue_limit=self.settings.queue_limit,
                         request_timeout_s=self.settings.request_timeout_s,
                         default_max_tokens=self.settings.default_max_tokens, retry_after=self.settings.retry_after_s)
        self._admitting[model] = self._admitting.get(model, 0) + 1  # no await since the count was read
        return job, workers

    async def _admit_without_worker(self, job: Job, catalogued: bool, *,
                                    registry_empty: bool) -> tuple[Job, list[RegistryEntry]]:
        """A job for a model with no live worker: queued for a node agent's load, for the workers a Redis failure
        hid, or for one that scales up (LLMFLEET_WORKER_WAIT_S); else 503 (known model) or 404."""
        model = job.model
        if catalogued:  # a node agent loads it: the queued job is the demand it sees
            return await self._admit_cold(job)
        if self.health.recently_failed(self.registry_grace_s()) and (registry_empty or await self._registry.is_known(model)):
            # Redis just failed: the registry is unknown, not empty; queue (the stream keeps it, keep-alives
            # go out) for the workers that register again within a moment
            log.info("no live worker of %s in the registry right after a Redis failure; queueing %s", model, job.id)
            return await self._admit_by_count(job)
        if await self._registry.is_known(model):
            if self.settings.worker_wait_s > 0:  # scaled to zero, or its workers restarting: wait for one
                log.info("no live worker of %s; %s waits up to %.0fs for one", model, job.id, self.settings.worker_wait_s)
                admitted = await self._admit_by_count(job)
                self._awaiting_worker.add(job.id)
                return admitted
            raise NoWorkerAvailable(f"no worker serving model '{model}' is alive right now; please retry",
                                    retry_after=self.settings.retry_after_s)
        if registry_empty:  # an empty registry proves nothing (starting up, or Redis came back empty): retryable
            raise NoWorkerAvailable("no worker is registered right now (the cluster is starting, or Redis restarted); "
                                    "please retry", retry_after=self.settings.retry_after_s)
        raise ModelNotFound(f"The model '{model}' does not exist", param="model")

    async def _admit_cold(self, job: Job) -> tuple[Job, list[RegistryEntry]]:
        """Admit a job for a catalogued model no worker serves yet (queue limit only: the node's load timeout
        bounds the wait); a remembered load failure is its 503."""
        model = job.model
        await self._pool.check_failure(model)
        if isinstance(job, GenerateJob) and job.loras:  # adapters are named by loaded workers only
            await self._pool.command("load", model)
            raise NoWorkerAvailable(f"model '{model}' is being loaded; its LoRA adapters can be used once it is "
                                    "ready; please retry", retry_after=self.settings.retry_after_s)
        return await self._admit_by_count(job)

    async def _admit_by_count(self, job: Job) -> tuple[Job, list[RegistryEntry]]:
        """Admit a job no live worker is known for: the queue's count limit only."""
        model = job.model
        waiting = (await self.queue_view.state(model)).waiting
        waiting += self._admitting.get(model, 0)
        if waiting >= self.settings.queue_limit:
            raise QueueFull(f"model '{model}' has {waiting} requests waiting, the limit is "
                            f"{self.settings.queue_limit}; please retry", retry_after=self.settings.retry_after_s)
        self._admitting[model] = self._admitting.get(model, 0) + 1
        return job, []

    async def has_live_worker(self, model: str) -> bool:
        """Whether a worker of `model` is alive now (a fresh registry read); True when Redis cannot tell."""
        try:
            return any(w.model == model for w in await self._registry.live_workers(RECHECK_S))
        except Unavailable:
            return True

    async def waiting(self, model: str) -> int:
        """Jobs of `model` queued but not yet taken by any worker, over all its priority classes."""
        return (await self.queue_state(model)).waiting

    async def queue_state(self, model: str) -> QueueState:
        """The model's jobs by state (waiting, in flight, per worker), read now (see gateway/cluster/queue_view.py)."""
        return await read_queue_state(self.redis, model, self.settings.retry_after_s)


def _subscriber(redis: Redis, settings: Settings, **options: Any) -> Subscriber | ClusterSubscriber:
    """One pub/sub connection; on a Redis Cluster, one per primary with sharded pub/sub (sharded_subscriber.py)."""
    if not sharded(redis):
        return Subscriber(redis, **options)
    return ClusterSubscriber(redis, node_clients(settings.redis_url), **options)  # type: ignore[arg-type]
