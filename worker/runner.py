"""The worker process loop: take jobs from the model's stream, drive the scheduler, publish events."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from shared import codec, keys
from shared.codec import WireFormatError
from shared.errors import (
    DeadLettered,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    LLMFleetError,
    Unavailable,
)
from shared.messages import ChoiceEndEvent, DoneEvent, EmbedJob, GenerateJob, Job, TextJob, TokenEvent, Usage
from shared.settings import Settings
from worker.cancel_listener import CancelListener
from worker.encoder_scheduler import new_scheduler
from worker.engine.engine import Engine
from worker.engine.errors import EngineError
from worker.fencing import Grant, Lease, take_ownership
from worker.heartbeat import Heartbeat
from worker.jobs import embedding_request, generation_request, text_answer
from worker.loras import AdapterSet
from worker.publisher import EventPublisher
from worker.resume import JournalState, JournalUnusable, read_journal
from worker.scheduler import SchedulerConfig
from worker.stealing import Stealer, ensure_group, reclaim_streams
from worker.takeover import claim_own, claim_stalled, dead_letter, own_pending

log = logging.getLogger(__name__)
RECLAIM_EVERY_S = 0.5  # how often a worker looks for dead or silent workers' jobs (failover: TTL + this)
EXPORTED_STATS = frozenset({  # SchedulerStats fields every gateway's /metrics shows per worker
    "active", "queue_depth", "kv_blocks_used", "kv_blocks_total", "prefix_queries", "prefix_hits",
    "prefix_tokens_hit", "preemptions", "prompt_tokens", "generated_tokens", "requests_finished",
    "requests_cancelled", "requests_failed", "steps", "speculated_tokens", "accepted_tokens", "tokens_left"})
IDLE_BLOCK_MS = 200
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
                 scheduler_config: SchedulerConfig | None = None, worker_id: str | None = None) -> None:
        self.engine = engine
        self.redis = redis
        self.settings = settings
        self.model = model
        self.worker_id = worker_id or f"{model}-{uuid.uuid4().hex[:8]}"
        self.streams = keys.jobs_streams(model)  # the shared streams, highest priority first
        self.own_streams = keys.worker_jobs_streams(model, self.worker_id)  # jobs placed on this worker
        self.read_order = [s for pair in zip(self.own_streams, self.streams, strict=True) for s in pair]
        self.stealer = Stealer(redis, model, self.worker_id, steal_after_s=settings.steal_after_s)
        config = scheduler_config or SchedulerConfig(
            max_sequences=settings.slots, max_batch_tokens=settings.max_batch_tokens,
            max_prefill_tokens=settings.max_prefill_tokens, kv_budget_mib=settings.kv_budget_mib,
            kv_dtype=settings.kv_dtype,
            prefix_cache=bool(settings.prefix_cache), max_queue=settings.queue_limit)
        self.scheduler = new_scheduler(engine, config)
        self.publisher = EventPublisher(redis, engine.tokenizer, settings.request_timeout_s + 60)
        self.stop_requested = threading.Event()
        self.ready = threading.Event()  # set once registered and listening
        self._held: dict[str, HeldJob] = {}
        self._failures = 0  # consecutive failed loop turns (backoff)
        self._lock = threading.Lock()
        self._lost: set[tuple[str, str]] = set()  # (stream, entry) whose lease renewal was refused: to drop
        self._last_reclaim = 0.0
        self._orphans: dict[str, list[str]] = {}  # stream -> entries an earlier process with this id left pending
        self.served = 0  # requests that ended here (any way)
        self.decode_capacity = 0.0  # tokens/s of a full decode step, measured when run() starts
        self.heartbeat = Heartbeat(redis, worker_id=self.worker_id, model=model, slots=self.scheduler.config.max_sequences,
                                   interval_s=settings.heartbeat_interval_s, ttl_s=settings.heartbeat_ttl_s,
                                   gauges=self._gauges, held_jobs=self._leases, stats=self._stats,
                                   on_lost=self._lost_leases, loras=lambda: self.adapters.snapshot(),
                                   opens_thinking=engine.opens_thinking)
        self.cancels = CancelListener(redis, model, held=self._held_ids)
        self.adapters = AdapterSet(engine.model, model, max_count=settings.max_loras,
                                   max_bytes=int(settings.lora_memory_mib * (1 << 20)))

    # ---- bookkeeping used by the heartbeat thread ----------------------------------------------------------

    def _load(self) -> int:
        with self._lock:
            return sum(h.width for h in self._held.values())

    def _gauges(self) -> dict[str, int]:
        return {"load": self._load(), "served": self.served}

    def _stats(self) -> dict[str, float]:
        """The scheduler's counters and gauges as published for the fleet's /metrics (numbers only)."""
        stats = dataclasses.asdict(self.scheduler.stats)
        exported = {name: float(value) for name, value in stats.items() if name in EXPORTED_STATS}
        exported["decode_capacity"] = round(self.decode_capacity, 2)  # tokens/s at full batch (admission)
        exported["context_length"] = float(self.engine.context_length)  # Ollama's /api/show, /api/ps, num_ctx
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

    def _free_width(self) -> int:
        return self.scheduler.config.max_sequences - self._load()

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def ensure_group(self) -> None:
        """Create the model's shared streams and this worker's own (one per priority class) and their consumer
        groups where missing, and list this worker among those with own streams."""
        for stream in self.read_order:
            ensure_group(self.redis, stream)
        self.redis.sadd(keys.placed_workers(self.model), self.worker_id)

    def run(self) -> None:
        """Serve until stop_requested is set; then take nothing new, finish what is held, deregister."""
        self.ensure_group()
        self._orphans = own_pending(self.redis, reclaim_streams(self.redis, self.model), self.worker_id)
        if self._orphans:
            log.info("worker %s: an earlier process under this id left %d jobs pending; taking them back",
                     self.worker_id, sum(len(ids) for ids in self._orphans.values()))
        self.decode_capacity = self.engine.measure_decode_rate(self.scheduler.config.max_sequences)
        log.info("worker %s: a full decode step runs at %.0f tokens/s", self.worker_id, self.decode_capacity)
        self._safe(lambda: self.adapters.sync(self.redis, force=True))  # the desired adapters, before registering
        self.cancels.start()
        self.heartbeat.start()
        self.ready.set()
        log.info("worker %s serving %s with %d slots", self.worker_id, self.model, self.scheduler.config.max_sequences)
        drain_until = math.inf
        try:
            while True:
                if self.stop_requested.is_set() and self.heartbeat.state != "draining":
                    self.heartbeat.state = "draining"
                    self._safe(self.heartbeat.beat)
                    drain_until = time.monotonic() + self.settings.drain_timeout_s
                    log.info("worker %s draining %d jobs", self.worker_id, len(self._held))
                if self.heartbeat.state == "draining" and not self._held:
                    return
                if time.monotonic() > drain_until:  # unacked, they resume on another worker once we deregister
                    log.warning("worker %s: drain timeout (LLMFLEET_DRAIN_TIMEOUT_S=%g); leaving %d jobs to the "
                                "other workers", self.worker_id, self.settings.drain_timeout_s, len(self._held))
                    return
                self._safe(self.run_once)
        finally:
            self.cancels.stop()
            self.heartbeat.stop()
            self._safe(self.heartbeat.deregister)
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
        """One turn: cancels, deadlines, intake (and reclaim), one scheduler step, one publish round trip."""
        acks: list[Entry] = []
        self._drop_lost_leases()
        for request_id in self.cancels.drain():
            self._cancel(request_id, acks)
        self._expire_deadlines(acks)
        self.adapters.sync(self.redis)
        if self.heartbeat.state == "ready":
            try:
                if time.monotonic() - self._last_reclaim > RECLAIM_EVERY_S:
                    self._last_reclaim = time.monotonic()
                    self._reclaim(acks)
                self._intake(acks, block=not self.scheduler.has_work and not acks and not self.publisher.backlog)
            except RedisError as exc:
                self._recreate_lost_group(exc)
                if not self.scheduler.has_work:
                    raise  # nothing to step: the loop backs off (and recreates a lost group)
                # Redis is away but sequences run: keep stepping; their events wait in the publisher
        ended = self.publisher.add_steps(self.scheduler.step())
        acks.extend(self._release(rid) for rid in ended if rid in self._held)
        try:
            self.publisher.flush(acks)
        finally:
            for request_id, owner in self.publisher.fenced_off:
                self._fenced(request_id, f"its events were refused; owner {owner} has it now")
            self.publisher.fenced_off.clear()

    # ---- intake ------------------------------------------------------------------------------------------

    def _intake(self, acks: list[Entry], *, block: bool) -> None:
        """Read as many new jobs as there are free slots, highest priority class first (in a class: the jobs
        placed on this worker, then the shared ones), and take them; with slots still free, other workers'
        overdue or orphaned placed jobs (worker/stealing.py); with nothing to read anywhere (and `block`),
        wait briefly on this worker's streams at once."""
        free = self._free_width()
        if free <= 0:
            return
        others = self.stealer.plan(free) if self.stealer.due() else {}
        replies = []
        for priority, own, shared in zip(keys.PRIORITY_ORDER, self.own_streams, self.streams, strict=True):
            for stream, count in [(own, free), (shared, free), *others.get(priority, [])]:
                reply = self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, {stream: ">"}, count=min(count, free))
                got = sum(len(messages) for _stream, messages in reply or [])
                if got and stream != own and stream != shared:
                    log.info("took %d job(s) placed on another worker from %s", got, stream)
                free -= got
                replies += reply or []
                if free <= 0:
                    break
            if free <= 0:
                break
        if not replies and block:
            replies = self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, dict.fromkeys(self.read_order, ">"),
                                            count=1, block=IDLE_BLOCK_MS) or []
        jobs = []
        for stream, messages in replies:
            for message_id, fields in messages:
                job = self._decode(_text(stream), _text(message_id), fields, acks)
                if job is not None:
                    jobs.append((_text(stream), _text(message_id), job))
        self._take(jobs, acks, takeover=False)

    def _reclaim(self, acks: list[Entry]) -> None:
        """Take over jobs of dead workers (registry entry expired) or silent ones (lease passed) and resume them."""
        self.stealer.forget_dead()
        free = self._free_width()
        if free <= 0:
            return
        jobs = self._claim_orphans(free, acks)
        free -= len(jobs)
        if self.heartbeat.recovering():  # after a Redis outage every registry entry looked expired: wait a TTL
            free = 0
        for stream in reclaim_streams(self.redis, self.model):
            if free <= 0:
                break
            try:
                claimed = claim_stalled(self.redis, stream, self.worker_id, count=free,
                                        ttl_s=self.settings.heartbeat_ttl_s, lease_s=self.settings.lease_s,
                                        request_id_of=_request_id_of)
            except ResponseError as exc:
                if stream in self.streams or stream in self.own_streams:
                    raise  # NOGROUP on a stream of this worker: the loop recreates it
                log.debug("skipping %s in the reclaim: %s", stream, exc)  # forgotten meanwhile
                continue
            free -= len(claimed)
            for message_id, fields in claimed:
                mid = _text(message_id)
                job = self._decode(stream, mid, fields, acks)  # None: trimmed away or unreadable, acked and dropped
                if job is not None and job.id not in self._held:
                    jobs.append((stream, mid, job))
        self._take(jobs, acks, takeover=True)

    def _claim_orphans(self, free: int, acks: list[Entry]) -> list[tuple[str, str, Job]]:
        """Up to `free` of the jobs an earlier process under this worker's id held when it died, claimed back."""
        jobs: list[tuple[str, str, Job]] = []
        for stream in list(self._orphans):
            if free <= 0:
                break
            batch, rest = self._orphans[stream][:free], self._orphans[stream][free:]
            for message_id, fields in claim_own(self.redis, stream, self.worker_id, batch):
                mid = _text(message_id)
                job = self._decode(stream, mid, fields, acks)
                if job is not None and job.id not in self._held:
                    jobs.append((stream, mid, job))
            free -= len(batch)
            if rest:
                self._orphans[stream] = rest
            else:
                del self._orphans[stream]
        return jobs

    def _take(self, jobs: list[tuple[str, str, Job]], acks: list[Entry], *, takeover: bool) -> None:
        """Own each (stream, entry id, job) with a new epoch (fencing off any earlier owner), then start, resume
        or set it aside."""
        for stream in dict.fromkeys(s for s, _mid, _job in jobs):  # each stream once, in reading order
            mine = [((s, mid), job) for s, mid, job in jobs if s == stream]
            grants = take_ownership(self.redis, stream, self.worker_id, [(job.id, e[1]) for e, job in mine],
                                    ttl_s=self.publisher.journal_ttl_s)
            for (entry, job), grant in zip(mine, grants, strict=True):
                if grant.status == "lost":
                    log.info("job %s was claimed by another worker before this one could own it; leaving it", job.id)
                elif grant.status == "done":
                    acks.append(entry)  # it ended; only the ack was missing
                else:
                    self.publisher.own(job.id, grant.owner, entry)
                    if takeover or grant.previous:
                        self._take_over(entry, job, grant, acks)
                    else:
                        self._accept(entry, job, acks, owner=grant.owner)

    def _take_over(self, entry: Entry, job: Job, grant: Grant,
                   acks: list[Entry]) -> None:
        """Continue a job another worker held, from its journal (read after the fence went up)."""
        try:
            state: JournalState | None = read_journal(self.redis, job.id)
            next_seq = state.next_seq
        except JournalUnusable as exc:
            log.warning("cannot resume job %s: %s", job.id, exc)
            state, next_seq = None, exc.next_seq
        log.info("took over job %s as owner epoch %d (delivery %d, previous owner %s, %s)", job.id, grant.epoch,
                 grant.deliveries, grant.previous or "none", "journal unusable" if state is None
                 else f"{next_seq} events already sent")
        if state is not None and state.terminal:
            acks.append(entry)  # it ended; only the ack was missing
        elif grant.deliveries > self.settings.max_deliveries:
            self._dead_letter(entry, job, grant, next_seq, acks)
        elif state is not None and next_seq == 0:
            self._accept(entry, job, acks, owner=grant.owner)  # nothing was sent: a plain start
        elif state is None or not isinstance(job, GenerateJob):
            self.publisher.resume_from(job.id, next_seq)
            self.publisher.add_error(job.id, Unavailable(
                "the worker serving this request stopped and the request cannot be resumed; please retry",
                retry_after=1.0))
            acks.append(entry)
        else:
            self.publisher.resume_from(job.id, next_seq)
            self._accept(entry, job, acks, owner=grant.owner, resume=state)

    def _dead_letter(self, entry: Entry, job: Job, grant: Grant, next_seq: int,
                     acks: list[Entry]) -> None:
        """Set a poison job aside (taken over too often without an ack) and end it with a clear error."""
        tries = grant.deliveries - 1  # this delivery is not run
        dead_letter(self.redis, self.model, codec.encode_job(job), worker_id=self.worker_id, deliveries=tries)
        log.warning("dead-lettered job %s: delivered %d times without finishing (LLMFLEET_MAX_DELIVERIES=%d)",
                    job.id, tries, self.settings.max_deliveries)
        self.publisher.resume_from(job.id, next_seq)
        self.publisher.add_error(job.id, DeadLettered(
            f"this request was started {tries} times and every worker running it stopped before it finished; "
            "it was set aside and will not be retried"))
        acks.append(entry)

    def _decode(self, stream: str, message_id: str, fields: dict | None, acks: list[Entry]) -> Job | None:
        """The job in a stream entry; an entry that cannot be read is acked and dropped (None)."""
        try:
            return codec.decode_job((fields or {})[keys.JOB_FIELD.encode()])
        except (WireFormatError, KeyError) as exc:
            log.warning("dropping undecodable job %s: %s", message_id, exc)
            acks.append((stream, message_id))
            return None

    def _accept(self, entry: Entry, job: Job, acks: list[Entry], *, owner: str,
                resume: JournalState | None = None) -> None:
        """Start a job (or continue a reclaimed one from its journal), or end it at once with a terminal event."""
        if time.time() > job.deadline:
            self.publisher.add_error(job.id, DeadlineExceeded("the request's deadline passed before it started"))
            acks.append(entry)
            return
        if self.redis.exists(keys.cancelled_marker(job.id)):
            self._end_without_tokens(job, "cancelled", prompt_tokens=0)
            acks.append(entry)
            return
        log.info("job %s", job.describe())
        try:
            if isinstance(job, TextJob):  # answered now: no batch slot, nothing held
                answer = text_answer(self.engine, job)
                self.publisher.add_event(DoneEvent(id=job.id, seq=self.publisher.next_seq(job.id),
                                                   usage=Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0),
                                                   **answer))
                acks.append(entry)
                return
            if isinstance(job, EmbedJob):
                self.scheduler.add_embedding(embedding_request(self.engine, job))
                with self._lock:
                    self._held[job.id] = HeldJob(entry[1], job, 1, entry[0], owner)
                return
            loras = self.adapters.resolve(job.loras, self.redis) if job.loras else ()
            request = generation_request(self.engine, job, default_max_tokens=self.settings.default_max_tokens,
                                         loras=loras)
            if resume is not None:
                request.resume_tokens = [resume.tokens.get(i, []) for i in range(job.n)]
                request.resume_ended = set(resume.ended)
                if resume.echoed:  # the echo (and its prompt logprobs) went out before the takeover
                    request.prompt_logprobs = None
            if job.echo and request.prompt_logprobs is None and (resume is None or not resume.echoed):
                text = self.engine.tokenizer.decode(request.prompt_ids, skip_special=False)
                for index in range(job.n):
                    self.publisher.add_event(TokenEvent(id=job.id, seq=self.publisher.next_seq(job.id), index=index,
                                                        text=text, token_ids=list(request.prompt_ids), echo=True))
            if request.params.max_tokens == 0 and request.prompt_logprobs is None:  # no tokens, finish "length"
                self._end_without_tokens(job, "length", prompt_tokens=len(request.prompt_ids))
                acks.append(entry)
                return
            self.scheduler.add(request)
        except LLMFleetError as exc:
            self.publisher.add_error(job.id, exc)
            acks.append(entry)
            return
        except (ValueError, EngineError) as exc:
            self.publisher.add_error(job.id, InvalidRequest(str(exc)))
            acks.append(entry)
            return
        except Exception as exc:  # one bad job must never take the worker down
            log.exception("job %s failed on intake", job.id)
            self.publisher.add_error(job.id, InternalError(f"the worker could not start this request ({type(exc).__name__})"))
            acks.append(entry)
            return
        with self._lock:
            self._held[job.id] = HeldJob(entry[1], job, job.n, entry[0], owner)

    def _end_without_tokens(self, job: Job, reason: str, *, prompt_tokens: int) -> None:
        """End a job with no generated tokens: every choice ends with `reason`, then Done (e.g. cancelled while
        it waited in the stream, or max_tokens 0)."""
        for index in range(job.n if isinstance(job, GenerateJob) else 0):
            self.publisher.add_event(ChoiceEndEvent(id=job.id, seq=self.publisher.next_seq(job.id), index=index,
                                                    finish_reason=reason))
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=0, total_tokens=prompt_tokens)
        self.publisher.add_event(DoneEvent(id=job.id, seq=self.publisher.next_seq(job.id), usage=usage))

    # ---- cancels and deadlines -------------------------------------------------------------------------

    def _release(self, request_id: str) -> tuple[str, str]:
        with self._lock:
            held = self._held.pop(request_id)
            self.served += 1
        return (held.stream, held.message_id)

    def _drop_lost_leases(self) -> None:
        """Drop the held jobs whose lease renewal the heartbeat found refused (another worker owns them)."""
        with self._lock:
            lost, self._lost = self._lost, set()
        for request_id in [rid for rid, h in list(self._held.items()) if (h.stream, h.message_id) in lost]:
            self._fenced(request_id, "its lease renewal was refused")

    def _fenced(self, request_id: str, why: str) -> None:
        """Another worker took this request over (this one stalled past its lease): drop it, write nothing."""
        if request_id not in self._held:
            return
        self.scheduler.cancel(request_id)
        self.publisher.forget(request_id)
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


def _request_id_of(fields: dict) -> str | None:
    """The request id of a job stream entry (None when it cannot be read)."""
    try:
        return codec.decode_job(fields[keys.JOB_FIELD.encode()]).id
    except (WireFormatError, KeyError):
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

