"""The worker process loop: take jobs from the model's stream, drive the scheduler, publish events."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from shared import keys
from shared.errors import DeadlineExceeded
from shared.heap import freeze_start_up
from shared.messages import Job
from shared.settings import Settings
from worker.engine.engine import Engine
from worker.failover.continuation import Continuation, continuation, ending_error
from worker.failover.fencing import Lease
from worker.failover.resume import JournalState
from worker.failover.stealing import ensure_group, reclaim_streams
from worker.failover.takeover import own_pending
from worker.loras import AdapterSet
from worker.model_facts import read_facts_then_digest
from worker.schedule.encoder_scheduler import new_scheduler
from worker.schedule.scheduler import SchedulerConfig
from worker.serve.cancel_listener import CancelListener
from worker.serve.heartbeat import Heartbeat
from worker.serve.intake import JobIntake
from worker.serve.job_feeder import JobFeeder
from worker.serve.publisher import EventPublisher
from worker.serve.taken_job import TakenJob
from worker.serve.tracing import JobTracer
from worker.serve.warmup import warm_up, warmup_jobs

log = logging.getLogger(__name__)
EXPORTED_STATS = frozenset({  # SchedulerStats fields every gateway's /metrics shows per worker
    "active", "queue_depth", "kv_blocks_used", "kv_blocks_total", "prefix_queries", "prefix_hits",
    "prefix_tokens_hit", "preemptions", "prompt_tokens", "generated_tokens", "requests_finished",
    "requests_cancelled", "requests_failed", "steps", "interrupted_steps", "speculated_tokens", "accepted_tokens",
    "tokens_left"})
IDLE_WAIT_S = 0.2  # an idle loop waits this long for a taken job before its next turn
BACKPRESSURE_WAIT_S = 0.05  # with the publish queue full, the loop waits this long per turn for room
Entry = tuple[str, str]  # (job stream, entry id): where a job is, and what its ack names


@dataclass
class HeldJob:
    """A job this worker has taken from the stream and not yet acked."""

    message_id: str
    job: Job
    width: int  # sequences it occupies (n)
    stream: str  # the job stream (priority class) it was read from
    owner: str  # "<epoch>:<worker_id>": the owner value its writes and lease renewals are fenced with


class WorkerRunner:
    """One model-pinned worker: intake, scheduling, publishing, cancels, deadlines, leases, draining."""

    def __init__(self, engine: Engine, redis: Redis, settings: Settings, *, model: str,
                 scheduler_config: SchedulerConfig | None = None, worker_id: str | None = None,
                 model_file: Path | None = None) -> None:
        self.engine = engine
        self.model_file = model_file  # its facts (size, digest, details) are read in run() and published
        self.facts: str | None = None
        self.redis = redis
        self.settings = settings
        self.model = model
        self.worker_id = worker_id or f"{model}-{uuid.uuid4().hex[:8]}"
        self.streams = keys.jobs_streams(model)  # the shared streams, highest priority first
        self.own_streams = keys.worker_jobs_streams(model, self.worker_id)  # jobs placed on this worker
        self.read_order = [s for pair in zip(self.own_streams, self.streams, strict=True) for s in pair]
        config = scheduler_config or SchedulerConfig.from_settings(settings)
        self.scheduler = new_scheduler(engine, config)
        self.publisher = EventPublisher(redis, engine.tokenizer, settings.request_timeout_s + 60, model=model)
        self.tracer = JobTracer(model, self.worker_id)  # spans of traced jobs (OTEL_EXPORTER_OTLP_ENDPOINT set)
        self.stop_requested = threading.Event()
        self.ready = threading.Event()  # set once registered and listening
        self._held: dict[str, HeldJob] = {}
        self._failures = 0  # consecutive failed loop turns (backoff)
        self._lock = threading.Lock()
        self._lost: set[tuple[str, str]] = set()  # (stream, entry) whose lease renewal was refused: to drop
        self.served = 0  # requests that ended here (any way)
        self.decode_capacity = 0.0  # tokens/s of a full decode step, measured when run() starts
        self.heartbeat = self._new_heartbeat()
        self.cancels = CancelListener(redis, model, held=self._held_ids)
        self.adapters = AdapterSet(engine.model, model, max_count=settings.max_loras,
                                   max_bytes=int(settings.lora_memory_mib * (1 << 20)))
        self.intake = JobIntake(engine, self.scheduler, self.publisher, self.adapters, redis, causal_embeddings=bool(
            settings.causal_embeddings), default_max_tokens=settings.default_max_tokens)
        self.feeder = self._new_feeder()

    def _new_heartbeat(self) -> Heartbeat:
        """The registry entry's writer: slots, load, leases, stats, adapters and what the gateway needs to know."""
        engine, settings = self.engine, self.settings
        tier = getattr(self.scheduler, "tier", None)  # the host KV tier (None: off, or an embedding model)
        return Heartbeat(self.redis, worker_id=self.worker_id, model=self.model,
                         slots=self.scheduler.config.max_sequences, interval_s=settings.heartbeat_interval_s,
                         ttl_s=settings.heartbeat_ttl_s, gauges=lambda: {"load": self._load(), "served": self.served},
                         held_jobs=self._leases, stats=self._stats, on_lost=self._lost_leases,
                         loras=lambda: self.adapters.snapshot(),
                         opens_thinking=engine.opens_thinking, opens_thinking_disabled=engine.opens_thinking_disabled,
                         harmony=engine.harmony, facts=lambda: self.facts,
                         drop_tier=tier and tier.tier.drop, kv_tier=tier.identity if tier else "")

    def _new_feeder(self) -> JobFeeder:
        """The thread that takes jobs from the model's streams as far as there is room."""
        return JobFeeder(self.redis, self.settings, model=self.model, worker_id=self.worker_id, streams=self.streams,
                         own_streams=self.own_streams, adapters=self.adapters, free_width=self._free_width,
                         accepting=lambda: self.heartbeat.state == "ready" and not self.stop_requested.is_set(),
                         holds=self._held.__contains__, ensure_group=self.ensure_group, recovering=self.heartbeat.recovering,
                         journal_ttl_s=self.publisher.journal_ttl_s, slots=self.scheduler.config.max_sequences,
                         outranked_width=self._outranked_width, below_share=self.scheduler.admission.below_share,
                         warm=getattr(self.scheduler, "tier", None) is not None)  # a host KV tier: takeovers warmed

    # ---- bookkeeping used by the heartbeat thread ----------------------------------------------------------

    def _load(self) -> int:
        with self._lock:
            return sum(h.width for h in self._held.values())

    def _stats(self) -> dict[str, float]:
        """The scheduler's counters and gauges as published for the fleet's /metrics (numbers only)."""
        stats = asdict(self.scheduler.stats)
        exported = {name: float(value) for name, value in stats.items() if name in EXPORTED_STATS}
        exported["decode_capacity"] = round(self.decode_capacity, 2)  # tokens/s at full batch (admission)
        exported["context_length"] = float(self.engine.context_length)  # Ollama's /api/show, /api/ps, num_ctx
        if getattr(self.scheduler, "tier", None) is not None:  # the host KV tier: this worker's counters, the file's bytes
            exported.update(self.scheduler.tier.exported())
        return exported

    def _held_ids(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def _leases(self) -> list[Lease]:
        with self._lock:
            return [Lease(h.message_id, h.job.id, h.owner, h.stream) for h in self._held.values()]

    def _lost_leases(self, entries: list[tuple[str, str]]) -> None:
        """Called by the heartbeat: these (stream, entry) held jobs belong to another worker now (taken over)."""
        with self._lock:
            self._lost.update(entries)

    def _outranked_width(self, index: int) -> int:
        """Slots held by jobs of a lower priority class than keys.PRIORITY_ORDER[index] (preemptible for it)."""
        order = {name: i for i, name in enumerate(keys.PRIORITY_ORDER)}
        with self._lock:
            return sum(h.width for h in self._held.values() if order.get(h.job.priority, 2) > index)

    def _free_width(self) -> int:
        return self.scheduler.config.max_sequences - self._load()

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def ensure_group(self) -> None:
        """Create the model's shared streams and this worker's own (one per priority class) and their consumer
        groups where missing, and list this worker among those with own streams."""
        for stream in self.read_order:
            ensure_group(self.redis, stream)
        self.redis.sadd(keys.placed_workers(self.model), self.worker_id)

    def _prepare_engine(self) -> None:
        """Measure a full decode step's rate (admission's first estimate), then warm the request path up."""
        self.decode_capacity = self.engine.measure_decode_rate(self.scheduler.config.max_sequences)
        log.info("worker %s: a full decode step runs at %.0f tokens/s", self.worker_id, self.decode_capacity)
        self._warm_up()

    def _warm_up(self) -> None:
        """The worker's own first requests before it registers (LLMFLEET_WARM_UP), then shared/heap.py's freeze."""
        if self.settings.warm_up:
            jobs = warmup_jobs(self.model, embedding_only=self.engine.embedding_only,
                               chat=self.engine.chat_template is not None, worker_id=self.worker_id)
            took = warm_up(self.intake, self.scheduler, self.publisher, jobs)
            log.info("worker %s: warm-up requests took %.2f s", self.worker_id, took)
        freeze_start_up()

    def run(self) -> None:
        """Serve until stop_requested is set; then take nothing new, finish what is held, deregister."""
        self._start()
        drain_until = math.inf
        try:
            while True:
                drain_until = self._note_drain(drain_until)
                if self._drained(drain_until):
                    return
                self._safe(self.run_once)
        finally:
            self._stop(drain_until)

    def _start(self) -> None:
        """Take back what an earlier process under this id left, load, register and start the threads."""
        self.ensure_group()
        self.feeder.orphans = own_pending(self.redis, reclaim_streams(self.redis, self.model), self.worker_id)
        if self.feeder.orphans:
            log.info("worker %s: an earlier process under this id left %d jobs pending; taking them back",
                     self.worker_id, sum(len(ids) for ids in self.feeder.orphans.values()))
        self._prepare_engine()
        self._safe(lambda: self.adapters.sync(self.redis, force=True))  # the desired adapters, before registering
        if self.model_file is not None:  # for Ollama's /api/tags and /api/show (the heartbeat publishes them)
            read_facts_then_digest(self.model_file, getattr(self.engine.model, "metadata", None),
                                   lambda facts: setattr(self, "facts", facts))
        self.cancels.start()
        self.heartbeat.start()
        self._safe(self.ensure_group)  # again: a peer forgets the streams of a member it finds unregistered
        self.publisher.start()
        self.feeder.start()
        self.ready.set()
        log.info("worker %s serving %s with %d slots", self.worker_id, self.model, self.scheduler.config.max_sequences)

    def _note_drain(self, drain_until: float) -> float:
        """Once a stop is requested: say so in the registry (draining) and start the drain timeout."""
        if not self.stop_requested.is_set() or self.heartbeat.state == "draining":
            return drain_until
        self.heartbeat.state = "draining"
        self._safe(self.heartbeat.beat)
        log.info("worker %s draining %d jobs", self.worker_id, len(self._held))
        return time.monotonic() + self.settings.drain_timeout_s

    def _drained(self, drain_until: float) -> bool:
        """Whether a draining worker is done: nothing held and nothing left to send, or the drain timed out."""
        if self.heartbeat.state == "draining" and not self._held and not self.publisher.backlog:
            return True
        if time.monotonic() > drain_until:  # unacked, they resume on another worker once we deregister
            log.warning("worker %s: drain timeout (LLMFLEET_DRAIN_TIMEOUT_S=%g); leaving %d jobs to the other "
                        "workers", self.worker_id, self.settings.drain_timeout_s, len(self._held))
            return True
        return False

    def _stop(self, drain_until: float) -> None:
        """Stop the threads (the publisher sends what it can until the drain deadline, at most 5 s), deregister."""
        self.feeder.stop()
        self.cancels.stop()
        self.publisher.sender.close(timeout_s=max(0.0, min(5.0, drain_until - time.monotonic())))
        self.heartbeat.stop()
        self._safe(self.heartbeat.deregister)
        if getattr(self.scheduler, "tier", None) is not None:  # its queued blocks written, the file kept
            self.scheduler.tier.close()
        log.info("worker %s stopped", self.worker_id)

    def _safe(self, fn: Callable[[], None]) -> None:
        """Run one part of the loop; Redis trouble and bugs are logged and retried with backoff, never fatal."""
        try:
            fn()
            self._failures = 0
        except ResponseError as exc:
            if not self._recreate_lost_group(exc):
                self._back_off(f"Redis error in the worker loop: {exc}")
        except RedisError as exc:
            self._back_off(f"Redis error in the worker loop: {exc} ({self.publisher.backlog} events and acks "
                           "kept for the retry)")
        except Exception:
            log.exception("unexpected error in the worker loop; continuing")
            time.sleep(0.5)

    def _recreate_lost_group(self, exc: Exception) -> bool:
        """On NOGROUP or a missing stream (Redis came back empty) recreate the streams and their groups; True if
        that was the error."""
        if "NOGROUP" not in str(exc) and "no such key" not in str(exc).lower():
            return False
        log.warning("the job stream or its group is gone (Redis restarted?); recreating it")
        self._safe(self.ensure_group)
        return True

    def _back_off(self, message: str) -> None:
        """Log and sleep 0.1 s, doubling per consecutive failure up to 2 s (the engine keeps its state)."""
        self._failures += 1
        if self._failures == 1 or self._failures % 10 == 0:
            log.warning("%s; retrying", message)
        time.sleep(min(2.0, 0.1 * 2 ** (self._failures - 1)))

    def run_once(self) -> None:
        """One turn: fenced-off jobs, cancels, deadlines, taken jobs, one scheduler step, its events sealed for
        the publisher thread. No Redis round trip: the step only waits when the publish queue is full."""
        acks: list[Entry] = []
        self._drop_lost_leases()
        for request_id, owner in self.publisher.take_fenced_off():
            self._fenced(request_id, f"its events were refused; owner {owner} has it now")
        self._start_taken(acks)  # before the cancels: a cancel sent while the feeder took its job finds it held
        self.intake.warm(self.feeder.warmer, busy=self.scheduler.has_work)  # suspect workers' jobs (prewarm.py)
        for request_id in self.cancels.drain():
            self._cancel(request_id, acks)
        self._expire_deadlines(acks)
        if not self.scheduler.has_work:
            self.publisher.flush(acks)
            if not acks:
                self.feeder.wait_for_jobs(IDLE_WAIT_S)  # idle: until a job is taken (or a moment passed)
            return
        if not self.publisher.room(BACKPRESSURE_WAIT_S):  # the publish queue is full: wait for Redis
            self.publisher.flush(acks)
            return
        events = self.scheduler.step(self.feeder.outranks)
        self.tracer.observe(events)
        ended = self.publisher.add_steps(events)
        acks.extend(self._release(rid) for rid in ended if rid in self._held)
        self.publisher.flush(acks)  # sealed: the publisher thread sends it with whatever else waits

    # ---- starting taken jobs ------------------------------------------------------------------------------

    def _start_taken(self, acks: list[Entry]) -> None:
        """Start, resume or end every job the feeder has taken since the last turn (no Redis round trip)."""
        taken = self.feeder.drain()
        try:
            for item in taken:
                entry = (item.stream, item.message_id)
                if item.job.id in self._held:
                    continue  # already running here
                self.publisher.own(item.job.id, item.grant.owner, entry)
                if item.takeover:
                    self._take_over(entry, item, acks)
                else:
                    self._accept(entry, item.job, acks, owner=item.grant.owner, cancelled=item.cancelled,
                                 fair=(item.tenant, item.newcomer))
        finally:
            self.feeder.settled(taken)

    def _take_over(self, entry: Entry, item: TakenJob, acks: list[Entry]) -> None:
        """Continue a job another worker held, as its journal decides (worker/failover/continuation.py)."""
        job, grant, state, next_seq = item.job, item.grant, item.journal, item.journal_next_seq
        log.info("took over job %s as owner epoch %d (read %d times, previous owner %s, %s)", job.id, grant.epoch,
                 grant.deliveries, grant.previous or "none", "journal unusable" if state is None
                 else f"{next_seq} events already sent")
        how = continuation(job, state, next_seq, item.dead_lettered)
        if how is Continuation.ACK:
            acks.append(entry)  # it ended; only the ack was missing
        elif how is Continuation.START:
            self._accept(entry, job, acks, owner=grant.owner, cancelled=item.cancelled)  # nothing sent: a start
        else:
            self.publisher.resume_from(job.id, next_seq)
            if how is Continuation.RESUME:
                self._accept(entry, job, acks, owner=grant.owner, resume=state, cancelled=item.cancelled)
            else:
                self.publisher.add_error(job.id, ending_error(how, job, item.dead_lettered, self.settings.max_deliveries))
                acks.append(entry)

    def _accept(self, entry: Entry, job: Job, acks: list[Entry], *, owner: str, cancelled: bool,
                resume: JournalState | None = None, fair: tuple[str, bool] = ("", False)) -> None:
        """Start a job (or continue a reclaimed one from its journal) and hold it, or ack it when it ended at
        once with a terminal event."""
        self.tracer.taken(job)
        width = self.intake.start(job, cancelled=cancelled, resume=resume, fair=fair)
        if width is None:
            self.tracer.ended(job.id)
            acks.append(entry)
            return
        with self._lock:
            self._held[job.id] = HeldJob(entry[1], job, width, entry[0], owner)

    # ---- cancels and deadlines -------------------------------------------------------------------------

    def _release(self, request_id: str) -> tuple[str, str]:
        self.tracer.ended(request_id)  # its spans, if the step that ended it did not write them
        with self._lock:
            held = self._held.pop(request_id)
            self.served += 1
        self.feeder.wake()  # a slot is free
        return (held.stream, held.message_id)

    def _drop_lost_leases(self) -> None:
        """Drop the held jobs whose lease renewal the heartbeat found refused (another worker owns them)."""
        with self._lock:
            lost, self._lost = self._lost, set()
        for request_id in [rid for rid, h in list(self._held.items()) if (h.stream, h.message_id) in lost]:
            self._fenced(request_id, "its lease renewal was refused")

    def _fenced(self, request_id: str, why: str) -> None:
        """Another worker took this request over (this one stalled past its lease): drop it, write nothing."""
        if request_id not in self._held:  # it ended (or was dropped) here meanwhile, e.g. while cut off from Redis
            log.warning("fenced off: job %s, no longer held here, was taken over by another worker (%s)", request_id, why)
            return
        self.scheduler.cancel(request_id)
        self.publisher.forget(request_id)
        self.tracer.ended(request_id)
        with self._lock:
            self._held.pop(request_id, None)
        log.warning("fenced off: job %s was taken over by another worker (%s); dropping it without "
                    "publishing or acking", request_id, why)

    def _cancel(self, request_id: str, acks: list[Entry]) -> None:
        if request_id not in self._held:
            return
        done = self.scheduler.cancel(request_id)
        if done is not None:
            self.publisher.add_done(done)
        acks.append(self._release(request_id))
        log.info("cancelled %s", request_id)

    def _expire_deadlines(self, acks: list[Entry]) -> None:
        now = time.time()
        for request_id in [rid for rid, h in self._held.items() if h.job.deadline < now]:
            self.scheduler.cancel(request_id)
            self.publisher.add_error(request_id, DeadlineExceeded("the request's deadline passed"))
            acks.append(self._release(request_id))
