"""The worker process loop: take jobs from the model's stream, drive the scheduler, publish events."""

from __future__ import annotations

import dataclasses
import logging
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
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    LLMFleetError,
    Unavailable,
)
from shared.messages import ChoiceEndEvent, DoneEvent, EmbedJob, GenerateJob, TokenEvent, Usage
from shared.settings import Settings
from worker.cancel_listener import CancelListener
from worker.engine.engine import Engine
from worker.engine.errors import EngineError
from worker.heartbeat import Heartbeat
from worker.jobs import generation_request
from worker.publisher import EventPublisher
from worker.resume import JournalState, JournalUnusable, read_journal
from worker.scheduler import Scheduler, SchedulerConfig
from worker.sequences import EmbeddingRequest, Priority

log = logging.getLogger(__name__)
RECLAIM_EVERY_S = 1.0  # how often a worker looks for dead or silent workers' jobs
EXPORTED_STATS = frozenset({  # SchedulerStats fields every gateway's /metrics shows per worker
    "active", "queue_depth", "kv_blocks_used", "kv_blocks_total", "prefix_queries", "prefix_hits",
    "prefix_tokens_hit", "preemptions", "prompt_tokens", "generated_tokens", "requests_finished",
    "requests_cancelled", "requests_failed", "steps", "speculated_tokens", "accepted_tokens"})
IDLE_BLOCK_MS = 200


@dataclass
class HeldJob:
    """A job this worker has taken from the stream and not yet acked."""

    message_id: str
    job: GenerateJob
    width: int  # sequences it occupies (n)


class WorkerRunner:
    """One model-pinned worker: intake, scheduling, publishing, cancels, deadlines, leases, draining."""

    def __init__(self, engine: Engine, redis: Redis, settings: Settings, *, model: str,
                 scheduler_config: SchedulerConfig | None = None, worker_id: str | None = None) -> None:
        self.engine = engine
        self.redis = redis
        self.settings = settings
        self.model = model
        self.worker_id = worker_id or f"{model}-{uuid.uuid4().hex[:8]}"
        self.stream = keys.jobs_stream(model)
        config = scheduler_config or SchedulerConfig(
            max_sequences=settings.slots, max_batch_tokens=settings.max_batch_tokens,
            max_prefill_tokens=settings.max_prefill_tokens, kv_budget_mib=settings.kv_budget_mib,
            prefix_cache=bool(settings.prefix_cache), max_queue=settings.queue_limit)
        self.scheduler = Scheduler(engine, config)
        self.publisher = EventPublisher(redis, engine.tokenizer, settings.request_timeout_s + 60)
        self.stop_requested = threading.Event()
        self.ready = threading.Event()  # set once registered and listening
        self._held: dict[str, HeldJob] = {}
        self._failures = 0  # consecutive failed loop turns (backoff)
        self._lock = threading.Lock()
        self._last_reclaim = 0.0
        self.served = 0  # requests that ended here (any way)
        self.heartbeat = Heartbeat(redis, worker_id=self.worker_id, model=model, slots=self.scheduler.config.max_sequences,
                                   interval_s=settings.heartbeat_interval_s, ttl_s=settings.heartbeat_ttl_s,
                                   gauges=self._gauges, held_jobs=self._held_ids, stats=self._stats)
        self.cancels = CancelListener(redis, model)

    # ---- bookkeeping used by the heartbeat thread ----------------------------------------------------------

    def _load(self) -> int:
        with self._lock:
            return sum(h.width for h in self._held.values())

    def _gauges(self) -> dict[str, int]:
        return {"load": self._load(), "served": self.served}

    def _stats(self) -> dict[str, float]:
        """The scheduler's counters and gauges as published for the fleet's /metrics (numbers only)."""
        stats = dataclasses.asdict(self.scheduler.stats)
        return {name: float(value) for name, value in stats.items() if name in EXPORTED_STATS}

    def _held_ids(self) -> list[str]:
        with self._lock:
            return [h.message_id for h in self._held.values()]

    def _free_width(self) -> int:
        return self.scheduler.config.max_sequences - self._load()

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def ensure_group(self) -> None:
        """Create the model's stream and consumer group if they do not exist yet."""
        try:
            self.redis.xgroup_create(self.stream, keys.JOBS_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def run(self) -> None:
        """Serve until stop_requested is set; then take nothing new, finish what is held, deregister."""
        self.ensure_group()
        self.cancels.start()
        self.heartbeat.start()
        self.ready.set()
        log.info("worker %s serving %s with %d slots", self.worker_id, self.model, self.scheduler.config.max_sequences)
        try:
            while True:
                if self.stop_requested.is_set() and self.heartbeat.state != "draining":
                    self.heartbeat.state = "draining"
                    self._safe(self.heartbeat.beat)
                    log.info("worker %s draining %d jobs", self.worker_id, len(self._held))
                if self.heartbeat.state == "draining" and not self._held:
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
        """On NOGROUP (Redis came back empty) recreate the stream and its group; True if that was the error."""
        if "NOGROUP" not in str(exc):
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
        acks: list[tuple[str, str]] = []
        for request_id in self.cancels.drain():
            self._cancel(request_id, acks)
        self._expire_deadlines(acks)
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
        self.publisher.flush(acks)

    # ---- intake ------------------------------------------------------------------------------------------

    def _intake(self, acks: list[tuple[str, str]], *, block: bool) -> None:
        """Read as many new jobs as there are free slots."""
        free = self._free_width()
        if free <= 0:
            return
        reply = self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, {self.stream: ">"}, count=free,
                                      block=IDLE_BLOCK_MS if block else None)
        for _stream, messages in reply or []:
            for message_id, fields in messages:
                job = self._decode(_text(message_id), fields, acks)
                if job is not None:
                    self._accept(_text(message_id), job, acks)

    def _reclaim(self, acks: list[tuple[str, str]]) -> None:
        """Take over jobs of dead workers (registry entry expired) or silent ones (lease passed) and resume them."""
        free = self._free_width()
        if free <= 0:
            return
        claimed = self._claim_from_dead_workers(free)
        if len(claimed) < free:
            reply = self.redis.xautoclaim(self.stream, keys.JOBS_GROUP, self.worker_id, start_id="0-0",
                                          min_idle_time=int(self.settings.lease_s * 1000), count=free - len(claimed))
            claimed += reply[1] if reply else []
        for message_id, fields in claimed:
            mid = _text(message_id)
            job = self._decode(mid, fields, acks)  # None: trimmed away or unreadable, acked and dropped
            if job is None or job.id in self._held:
                continue
            try:
                state = read_journal(self.redis, job.id)
            except JournalUnusable as exc:
                log.warning("cannot resume job %s: %s", job.id, exc)
                state = None
            log.info("reclaimed job %s (%s) from a dead or silent worker", job.id,
                     "journal unusable" if state is None else f"{state.next_seq} events already sent")
            self._resume(mid, job, state, acks)

    def _claim_from_dead_workers(self, count: int) -> list:
        """Pending entries of consumers whose registry entry has expired (failover by heartbeat TTL)."""
        claimed: list = []
        for consumer in self.redis.xinfo_consumers(self.stream, keys.JOBS_GROUP):
            name = _text(consumer["name"])
            if name == self.worker_id or self.redis.exists(keys.worker_key(name)):
                continue
            if not consumer.get("pending"):  # a dead worker that held nothing: forget it once it is long idle
                if consumer.get("idle", 0) > self.settings.lease_s * 1000:
                    self.redis.xgroup_delconsumer(self.stream, keys.JOBS_GROUP, name)
                continue
            pending = self.redis.xpending_range(self.stream, keys.JOBS_GROUP, min="-", max="+", count=count,
                                                consumername=name)
            ids = [p["message_id"] for p in pending]
            if ids:  # min idle: the dead worker's TTL; a live owner renews well within it
                min_idle = int(self.settings.heartbeat_ttl_s * 1000)
                claimed += [e for e in self.redis.xclaim(self.stream, keys.JOBS_GROUP, self.worker_id, min_idle, ids)
                            if e and e[1] is not None]
            if len(claimed) >= count:
                break
        return claimed[:count]

    def _resume(self, message_id: str, job: GenerateJob | EmbedJob, state: JournalState | None,
                acks: list[tuple[str, str]]) -> None:
        """Continue a reclaimed job from its journal (invisibly), or end it with a retryable error."""
        if state is not None and state.terminal:
            acks.append((self.stream, message_id))  # it ended; only the ack was missing
            return
        if state is not None and state.next_seq == 0:
            self._accept(message_id, job, acks)  # nothing was sent: a plain start
            return
        if state is None or not isinstance(job, GenerateJob):
            if state is not None:
                self.publisher.resume_from(job.id, state.next_seq)
            self.publisher.add_error(job.id, Unavailable(
                "the worker serving this request stopped and the request cannot be resumed; please retry",
                retry_after=1.0))
            acks.append((self.stream, message_id))
            return
        self.publisher.resume_from(job.id, state.next_seq)
        self._accept(message_id, job, acks, resume=state)

    def _decode(self, message_id: str, fields: dict | None, acks: list[tuple[str, str]]) -> GenerateJob | EmbedJob | None:
        """The job in a stream entry; an entry that cannot be read is acked and dropped (None)."""
        try:
            return codec.decode_job((fields or {})[keys.JOB_FIELD.encode()])
        except (WireFormatError, KeyError) as exc:
            log.warning("dropping undecodable job %s: %s", message_id, exc)
            acks.append((self.stream, message_id))
            return None

    def _accept(self, message_id: str, job: GenerateJob | EmbedJob, acks: list[tuple[str, str]], *,
                resume: JournalState | None = None) -> None:
        """Start a job (or continue a reclaimed one from its journal), or end it at once with a terminal event."""
        if time.time() > job.deadline:
            self.publisher.add_error(job.id, DeadlineExceeded("the request's deadline passed before it started"))
            acks.append((self.stream, message_id))
            return
        if self.redis.exists(keys.cancelled_marker(job.id)):
            self._end_without_tokens(job, "cancelled", prompt_tokens=0)
            acks.append((self.stream, message_id))
            return
        log.info("job %s", job.describe())
        try:
            if isinstance(job, EmbedJob):
                self.scheduler.add_embedding(self._embedding_request(job))
                with self._lock:
                    self._held[job.id] = HeldJob(message_id, job, 1)
                return
            request = generation_request(self.engine, job)
            if resume is not None:
                request.resume_tokens = [resume.tokens.get(i, []) for i in range(job.n)]
                request.resume_ended = set(resume.ended)
            if job.echo and (resume is None or not resume.echoed):
                text = self.engine.tokenizer.decode(request.prompt_ids, skip_special=False)
                for index in range(job.n):
                    self.publisher.add_event(TokenEvent(id=job.id, seq=self.publisher.next_seq(job.id), index=index,
                                                        text=text, token_ids=list(request.prompt_ids), echo=True))
            if request.params.max_tokens == 0:  # OpenAI's completions: no tokens, finish_reason "length"
                self._end_without_tokens(job, "length", prompt_tokens=len(request.prompt_ids))
                acks.append((self.stream, message_id))
                return
            self.scheduler.add(request)
        except LLMFleetError as exc:
            self.publisher.add_error(job.id, exc)
            acks.append((self.stream, message_id))
            return
        except (ValueError, EngineError) as exc:
            self.publisher.add_error(job.id, InvalidRequest(str(exc)))
            acks.append((self.stream, message_id))
            return
        except Exception as exc:  # one bad job must never take the worker down
            log.exception("job %s failed on intake", job.id)
            self.publisher.add_error(job.id, InternalError(f"the worker could not start this request ({type(exc).__name__})"))
            acks.append((self.stream, message_id))
            return
        with self._lock:
            self._held[job.id] = HeldJob(message_id, job, job.n)

    def _embedding_request(self, job: EmbedJob) -> EmbeddingRequest:
        """The scheduler request of an embed job: every input tokenized and checked."""
        inputs = []
        for i, item in enumerate(job.inputs):
            ids = self.engine.encode_prompt(item) if isinstance(item, str) else list(item)
            if not ids:
                raise InvalidRequest(f"input {i} is empty", param="input")
            if len(ids) > self.engine.context_length:
                raise InvalidRequest(f"input {i} has {len(ids)} tokens, over the context length "
                                     f"{self.engine.context_length}", param="input")
            if any(not 0 <= t < self.engine.model.config.vocab_size for t in ids):
                raise InvalidRequest(f"input {i} has a token id outside the vocabulary", param="input")
            inputs.append(ids)
        return EmbeddingRequest(job.id, inputs, pooling=job.pooling, normalize=job.normalize,
                                priority=Priority.parse(job.priority))

    def _end_without_tokens(self, job: GenerateJob | EmbedJob, reason: str, *, prompt_tokens: int) -> None:
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
        return (self.stream, held.message_id)

    def _cancel(self, request_id: str, acks: list[tuple[str, str]]) -> None:
        if request_id not in self._held:
            return
        done = self.scheduler.cancel(request_id)
        if done is not None:
            self.publisher.add_done(done)
        acks.append(self._release(request_id))
        log.info("cancelled %s", request_id)

    def _expire_deadlines(self, acks: list[tuple[str, str]]) -> None:
        now = time.time()
        for request_id in [rid for rid, h in self._held.items() if h.job.deadline < now]:
            self.scheduler.cancel(request_id)
            self.publisher.add_error(request_id, DeadlineExceeded("the request's deadline passed"))
            acks.append(self._release(request_id))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

