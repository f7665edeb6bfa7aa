"""Brings jobs to the worker loop from a thread of its own, so the decode step never waits on Redis for them.

Every Redis read the taking of a job needs happens here: new jobs (highest priority class first, this worker's
placed jobs before the shared ones; each class's fair queue released into its shared stream first, as much as
this worker has room for: shared/fair_queue.py FAIR_SCRIPT), other workers' overdue placed jobs
(worker/failover/stealing.py), dead or silent workers' jobs (worker/failover/takeover.py, every RECLAIM_EVERY_S;
with a host KV tier, suspect workers' jobs too, for the loop to warm: prewarm.py), the owner epoch
(worker/failover/fencing.py), the journal of a job taken over (worker/failover/resume.py), the cancel marker, the
dead-lettering of a poison job, and the LoRA desired set (worker/loras.py). The loop collects the results with
`drain()` and starts or ends each job without Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from shared import codec, keys
from shared.codec import WireFormatError
from shared.fair_queue import queue_taken, release_and_look, release_calls, release_fair
from shared.messages import Job
from shared.redis_commands import queue_job_done, reply_text, run
from shared.settings import Settings
from worker.failover.fencing import take_ownership
from worker.failover.prewarm import TakeoverWarmer
from worker.failover.stealing import Stealer, reclaim_streams
from worker.failover.takeover import claim_from_streams, claim_own, pending_counts, read_for_takeover
from worker.loras import AdapterSet
from worker.schedule.preemption import job_rank
from worker.schedule.sequences import Priority
from worker.serve.taken_job import TakenJob

log = logging.getLogger(__name__)
RECLAIM_EVERY_S = 0.5  # how often a worker looks for dead or silent workers' jobs (failover: TTL + this)
SWEEP_EVERY = 20  # every this many reclaims, every stream is looked at (dead consumers holding nothing forgotten);
# in between only those with pending entries: the look was 3-4 round trips a stream, most of this thread's CPU
IDLE_BLOCK_MS = 200  # a read with nothing waiting anywhere blocks this long on this worker's streams
FULL_WAIT_S = 0.05  # with no free slot, look again after this long (or when the loop frees one)
BUSY_POLL_S = 0.01  # a busy worker looks for jobs this often: one round trip tells whether any stream holds one
BUSY_BLOCK_MS = 50  # with none waiting, a busy worker blocks this long on the streams it has room for, so a new
# job (one that outranks running work included) is taken the moment it is written, not at the next look; an idle
# worker blocks IDLE_BLOCK_MS at a time, so it is ahead of a busy one in Redis's queue of blocked readers most of
# the time, and a new shared job goes to it. Each timeout is a wake-up with two round trips (the look, the read)
# that takes a core from the step's kernels: at 10 ms this thread was the worker's busiest after the kernels'


class JobFeeder:
    """A thread that takes as many jobs as there are free slots and hands them to the loop."""

    def __init__(self, redis: Redis, settings: Settings, *, model: str, worker_id: str, streams: list[str],
                 own_streams: list[str], adapters: AdapterSet, free_width: Callable[[], int],
                 accepting: Callable[[], bool], holds: Callable[[str], bool], ensure_group: Callable[[], None],
                 journal_ttl_s: int, slots: int, outranked_width: Callable[[int], int],
                 recovering: Callable[[], bool] = lambda: False, warm: bool = False,
                 below_share: Callable[[str, Priority], bool] = lambda _tenant, _priority: True) -> None:
        self.redis = redis
        self.settings = settings
        self.model = model
        self.worker_id = worker_id
        self.streams, self.own_streams = streams, own_streams
        self.read_order = [s for pair in zip(own_streams, streams, strict=True) for s in pair]
        self.stealer = Stealer(redis, model, worker_id, steal_after_s=settings.steal_after_s)
        self.adapters = adapters
        self._free_width = free_width  # the loop's free slots (not counting what waits in the inbox)
        self._accepting = accepting  # False while draining: nothing new is taken
        self._holds = holds  # whether the loop already holds a request (a reclaim skips it)
        self._ensure_group = ensure_group
        self.journal_ttl_s = journal_ttl_s
        self._slots = slots  # free_width() == slots: the worker is idle
        self._outranked_width = outranked_width  # slots held by jobs of classes below PRIORITY_ORDER[i]
        self._recovering = recovering  # just after a Redis outage: every registry entry looked expired
        self._below_share = below_share  # whether a tenant holds less than an equal share of a class (the loop's)
        self.warmer = TakeoverWarmer(model=model, worker_id=worker_id, interval_s=settings.heartbeat_interval_s,
                                     ttl_s=settings.heartbeat_ttl_s) if warm else None  # (with a host KV tier)
        self.orphans: dict[str, list[str]] = {}  # stream -> entries an earlier process with this id left pending
        self._inbox: list[TakenJob] = []
        self._tenants: dict[str, str] = {}  # job id -> the tenant its entry named, from its reading to its taking
        self._inbox_width = 0  # slots the inbox's jobs will occupy
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._last_reclaim = 0.0
        self._reclaims = 0  # reclaims so far (every SWEEP_EVERY-th looks at every stream)
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="job-feeder", daemon=True)

    # ---- the loop's side ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start taking jobs."""
        self._thread.start()

    def stop(self) -> None:
        """Stop taking jobs (what is in the inbox stays for drain())."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=IDLE_BLOCK_MS / 1000 + 5)

    def drain(self, wait_s: float = 0.0) -> list[TakenJob]:
        """The jobs taken since the last call (waiting up to wait_s for one); their slots count as used until
        `settled` is called."""
        with self._cond:
            if not self._inbox and wait_s > 0:
                self._cond.wait(wait_s)
            taken, self._inbox = self._inbox, []
            return taken

    def outranks(self, rank: int) -> bool:
        """Whether a job taken since the loop's last drain ranks above `rank` (worker/schedule/preemption.py
        job_rank; a newcomer whose tenant is at its share does not): the loop's running step stops for it
        (Scheduler.step, on the loop's thread, which owns the share's counts)."""
        with self._cond:
            inbox = [(Priority.parse(item.job.priority), item) for item in self._inbox]
        return any(job_rank(p, item.newcomer and self._below_share(item.tenant, p)) > rank for p, item in inbox)

    def wait_for_jobs(self, timeout_s: float) -> None:
        """Wait until a job is in the inbox, at most timeout_s."""
        with self._cond:
            if not self._inbox:
                self._cond.wait(timeout_s)

    def settled(self, taken: list[TakenJob]) -> None:
        """The loop has started (or ended) these jobs: their slots are its own now."""
        with self._cond:
            self._inbox_width -= sum(_width(t.job) for t in taken)
            self._cond.notify_all()

    def wake(self) -> None:
        """A slot was freed: look for work now."""
        with self._cond:
            self._cond.notify_all()

    def _free(self) -> int:
        with self._cond:
            return self._free_width() - self._inbox_width

    def _preemptible(self, index: int) -> int:
        """Slots a job of class PRIORITY_ORDER[index] may take from running lower-class work (the scheduler
        preempts it for them), less what the inbox will take."""
        with self._cond:
            return max(0, self._outranked_width(index) - self._inbox_width)

    # ---- the thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.adapters.sync(self.redis)  # at most every LORA_SYNC_S
                if not self._accepting() or (self._free() <= 0 and self._preemptible(0) <= 0):
                    with self._cond:
                        self._cond.wait(FULL_WAIT_S)
                    continue
                if time.monotonic() - self._last_reclaim > RECLAIM_EVERY_S:
                    self._last_reclaim = time.monotonic()
                    self._reclaim()
                self._intake()
                self._failures = 0
            except ResponseError as exc:
                if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
                    log.warning("the job stream or its group is gone (Redis restarted?); recreating it: %s", exc)
                    self._retry(self._ensure_group)
                else:
                    self._back_off(f"Redis error while taking jobs: {exc}")
            except RedisError as exc:
                self._back_off(f"Redis error while taking jobs: {exc}")
            except Exception:
                log.exception("unexpected error while taking jobs; continuing")
                self._stop.wait(0.5)

    def _retry(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except RedisError as exc:
            self._back_off(f"Redis error: {exc}")

    def _back_off(self, message: str) -> None:
        """Log and wait 0.1 s, doubling per consecutive failure up to 2 s."""
        self._failures += 1
        if self._failures == 1 or self._failures % 10 == 0:
            log.warning("%s; retrying", message)
        self._stop.wait(min(2.0, 0.1 * 2 ** (self._failures - 1)))

    def _intake(self) -> None:
        """Read as many new jobs as there are free slots, highest priority class first (in a class: the jobs
        placed on this worker, then the shared ones), then other workers' overdue placed jobs. With nothing to
        read anywhere, an idle worker waits briefly on all its streams at once, a busy one more briefly on the streams
        it has room for (a job that outranks its running work is taken the moment it is written)."""
        free = self._free()
        others = self.stealer.plan(free) if free > 0 and self.stealer.due() else {}
        busy = self._free_width() < self._slots
        waiting = self._release_and_look(free, look=busy and not others)
        if waiting is not None and not waiting:
            if not (readable := self._streams_with_room(free)):
                with self._cond:
                    self._cond.wait(BUSY_POLL_S)
                return
            replies = self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, dict.fromkeys(readable, ">"),
                                            count=1, block=BUSY_BLOCK_MS) or []
            self._take(self._jobs(replies), takeover=False)
            return
        replies = self._read_classes(free, others, waiting)
        if not replies and busy:  # poll again soon, leave blocking to idle workers
            with self._cond:
                self._cond.wait(BUSY_POLL_S)
            return
        if not replies:
            replies = self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, dict.fromkeys(self.read_order, ">"),
                                            count=1, block=IDLE_BLOCK_MS) or []
        self._take(self._jobs(replies), takeover=False)

    def _release_and_look(self, free: int, *, look: bool) -> set[str] | None:
        """Release each class's fair queue into its shared stream as far as this worker has room (FAIR_SCRIPT) and,
        with `look` (busy: a read per stream, each waiting for the GIL behind the engine's step, made a new job
        wait tens of milliseconds), which streams hold a job, in the same round trip (None: not looked)."""
        rooms = {p: max(free, self._preemptible(i)) for i, p in enumerate(keys.PRIORITY_ORDER)}
        if look:
            releases = release_calls(self.model, rooms, maxlen=self.settings.stream_maxlen)
            return run(self.redis, release_and_look(releases, self.read_order))
        run(self.redis, release_fair(self.model, rooms, maxlen=self.settings.stream_maxlen))
        return None

    def _read_classes(self, free: int, others: dict[str, list[tuple[str, int]]], waiting: set[str] | None) -> list:
        """Read each class's streams (own, shared, the steal plan's) up to its room, those in `waiting` only when
        looked at, highest class first."""
        replies = []
        for index, (priority, own, shared) in enumerate(zip(keys.PRIORITY_ORDER, self.own_streams, self.streams,
                                                            strict=True)):
            room = max(free, self._preemptible(index))  # full: a class that outranks running work still reads
            reads = [(own, room), (shared, room), *others.get(priority, [])] if room > 0 else []
            for stream, count in [(s, c) for s, c in reads if waiting is None or s in waiting]:
                elsewhere = stream != own and stream != shared  # placed on another worker
                reply = self._read(stream, min(count, room), elsewhere=elsewhere)
                got = sum(len(messages) for _stream, messages in reply)
                if got and elsewhere:
                    log.info("took %d job(s) placed on another worker from %s", got, stream)
                free, room = free - got, room - got
                replies += reply
                if room <= 0:
                    break
        return replies

    def _streams_with_room(self, free: int) -> list[str]:
        """This worker's own and the shared streams of every class a job of which it could start now (a free slot,
        or running work the class outranks), highest class first, no more streams than it has room for jobs (a
        blocking read returns up to one entry a stream)."""
        rooms = [max(free, self._preemptible(index)) for index in range(len(self.streams))]
        streams = [s for room, pair in zip(rooms, zip(self.own_streams, self.streams, strict=True), strict=True)
                   if room > 0 for s in pair]
        return streams[: max(rooms, default=0)]

    def _jobs(self, replies: list) -> list[tuple[str, str, Job]]:
        """(stream, entry id, job) of every readable entry of XREADGROUP replies (a poison one is set aside)."""
        jobs = []
        for stream, messages in replies:
            for message_id, fields in messages:
                job = self._decode(reply_text(stream), reply_text(message_id), fields)
                if job is not None:
                    jobs.append((reply_text(stream), reply_text(message_id), job))
        return jobs

    def _read(self, stream: str, count: int, *, elsewhere: bool) -> list:
        """XREADGROUP up to `count` new entries of one stream. Another worker's stream that is gone (a live worker
        forgot its dead owner's empty streams since the plan) reads as empty; this worker's own raise NOGROUP,
        and the run loop recreates them."""
        try:
            return self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, {stream: ">"}, count=count) or []
        except ResponseError as exc:
            if not elsewhere or "NOGROUP" not in str(exc):
                raise
            log.debug("skipping %s: %s", stream, exc)
            return []

    def _reclaim(self) -> None:
        """Take over jobs of dead workers (registry entry expired), stalled readers, silent ones (lease passed), and
        this worker's own entries whose read lost its reply (idle past takeover.LOST_READ_AFTER_S, never taken)."""
        self.stealer.forget_dead()
        free = self._free()
        jobs = self._claim_orphans(free)
        free -= len(jobs)
        if self._recovering():  # after a Redis outage every registry entry looked expired: wait a TTL
            free = 0
        streams = reclaim_streams(self.redis, self.model)
        self._reclaims += 1
        if self._reclaims % SWEEP_EVERY:  # skip the streams with nothing pending (one round trip for all)
            streams = [s for s, n in zip(streams, pending_counts(self.redis, streams), strict=True) if n != 0]
        # this worker's own entries whose read lost its reply come back here too (takeover.py); those an earlier
        # process or a failed taking left are _claim_orphans' (skipped)
        for stream, mid, fields in claim_from_streams(
                self.redis, streams, self.worker_id, model=self.model, count=free, ttl_s=self.settings.heartbeat_ttl_s,
                lease_s=self.settings.lease_s, skip=self.orphans, required={*self.streams, *self.own_streams}):
            job = self._decode(stream, mid, fields)  # None: trimmed away or unreadable, acked and dropped
            if job is not None and not self._holds(job.id):
                jobs.append((stream, mid, job))
        self._take(jobs, takeover=True)
        if self.warmer is not None and free > len(jobs) and self.warmer.look(self.redis, streams, free - len(jobs)):
            self.wake()  # an idle loop warms them now

    def _claim_orphans(self, free: int) -> list[tuple[str, str, Job]]:
        """Up to `free` of the jobs an earlier process under this worker's id held when it died, claimed back at
        once (they are this worker's own; the owner epoch still fences the dead process)."""
        jobs: list[tuple[str, str, Job]] = []
        for stream in list(self.orphans):
            if free <= 0:
                break
            batch, rest = self.orphans[stream][:free], self.orphans[stream][free:]
            for message_id, fields in claim_own(self.redis, stream, self.worker_id, batch):
                mid = reply_text(message_id)
                job = self._decode(stream, mid, fields)
                if job is not None and not self._holds(job.id):
                    jobs.append((stream, mid, job))
            free -= len(batch)
            if rest:
                self.orphans[stream] = rest
            else:
                del self.orphans[stream]
        return jobs

    def _take(self, jobs: list[tuple[str, str, Job]], *, takeover: bool) -> None:
        """Own each (stream, entry id, job) with a new epoch (fencing off any earlier owner), read what its
        start needs, and put it in the inbox. When Redis fails meanwhile (a command timed out: it may have run),
        the entries, pending for this worker now, are claimed back and taken again at the next reclaim, as an
        earlier process's are (a new epoch fences an owning that did go through)."""
        try:
            taken = self._own(jobs, takeover=takeover)
        except RedisError:
            for stream, mid, _job in jobs:
                self.orphans.setdefault(stream, []).append(mid)
            raise
        with self._cond:
            self._inbox += taken
            self._inbox_width += sum(_width(t.job) for t in taken)
            self._cond.notify_all()

    def _own(self, jobs: list[tuple[str, str, Job]], *, takeover: bool) -> list[TakenJob]:
        """_take's Redis part: the owner epochs, the cancel markers, a takeover's journal."""
        taken: list[TakenJob] = []
        for stream in dict.fromkeys(s for s, _mid, _job in jobs):  # each stream once, in reading order
            mine = [(mid, job) for s, mid, job in jobs if s == stream]
            grants = take_ownership(self.redis, stream, self.worker_id, self.model, [(job.id, mid) for mid, job in mine],
                                    ttl_s=self.journal_ttl_s)
            for (mid, job), grant in zip(mine, grants, strict=True):
                if grant.status == "lost":
                    log.info("job %s was claimed by another worker before this one could own it; leaving it", job.id)
                elif grant.status == "done":
                    self._ack(stream, mid)  # it ended; only the ack was missing
                else:
                    taken.append(TakenJob(stream, mid, job, grant, takeover or bool(grant.previous),
                                          tenant=self._tenants.get(job.id, "")))
        self._tenants.clear()  # each read's jobs are owned (or left) before the next read
        if not taken:
            return taken
        pipe = self.redis.pipeline(transaction=False)
        for item in taken:
            pipe.exists(keys.cancelled_marker(self.model, item.job.id))
        queue_taken(pipe, self.model, [(item.job.priority, item.tenant) for item in taken
                                       if not item.takeover and item.stream in self.streams])  # no longer waiting
        for item, cancelled in zip(taken, pipe.execute()[: len(taken)], strict=True):
            item.cancelled = bool(cancelled)
            if item.takeover:
                self._read_journal(item)
        return taken

    def _read_journal(self, item: TakenJob) -> None:
        """A takeover's journal (read after the fence went up); a poison job is dead-lettered (takeover.py)."""
        item.journal, item.journal_next_seq, item.journal_problem, item.dead_lettered = read_for_takeover(
            self.redis, item.job, item.grant.epoch, model=self.model, worker_id=self.worker_id,
            max_deliveries=self.settings.max_deliveries)

    def _ack(self, stream: str, message_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        queue_job_done(pipe, stream, message_id)
        pipe.execute()

    def _decode(self, stream: str, message_id: str, fields: dict | None) -> Job | None:
        """The job in a stream entry; an entry that cannot be read is acked and dropped (None)."""
        try:
            job = codec.decode_job((fields or {})[keys.JOB_FIELD.encode()])
            self._tenants[job.id] = reply_text((fields or {}).get(keys.TENANT_FIELD.encode(), b""))
            return job
        except (WireFormatError, KeyError) as exc:
            log.warning("dropping undecodable job %s: %s", message_id, exc)
            self._ack(stream, message_id)
            return None


def _width(job: Job) -> int:
    """Slots a job occupies once started (n for a generation, 1 for anything else)."""
    return int(getattr(job, "n", 1) or 1)
