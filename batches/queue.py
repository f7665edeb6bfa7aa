"""rq for batches: one rq job per batch, JSON-serialized, run only if its function is on the allow-list.

- Jobs are stored with rq's JSONSerializer (never pickle): the function's name and the batch id.
- AllowListedJob resolves a job's function from JOB_FUNCTIONS and nothing else: a job naming any other
  function (or a method of an instance) fails before anything is imported or called.
- BatchWorker is an rq SimpleWorker (no fork: a batch is one long asyncio run); it hands its job the settings,
  its heartbeat and its stop event. SIGTERM sets the event: the batch it runs stops at its next check and
  `run_batch_job` puts it back in the queue, then the worker exits; an idle worker exits at the end of its
  current BLMOVE (in a Redis outage, once Redis answers), not by an exception raised where the signal landed.
- Every client of the batch runner has the main pools' socket bounds (batches/redis_clients.py): a command on
  a connection a partition cut fails in COMMAND_TIMEOUT_S instead of waiting until TCP gives up. The rq
  worker's BLPOP blocks MAX_BLOCK_S at a time (rq's own default, worker_ttl - 15 s, would have it raise
  the socket timeout to 25 s); rq retries a dequeue that failed on its own.
- recover_orphans, run by every batch runner every second, finds batches whose runner died (kill -9,
  host lost): not finished, nobody holds their lease, their rq job not waiting in the queue, for longer than
  LLMFLEET_BATCH_LEASE_S. It counts an attempt and enqueues the batch again; the next run continues with
  the lines that have no result yet.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.worker import WorkerStatus

from batches import objects, runner
from batches.redis_clients import sync_client
from shared import keys
from shared.redis_commands import reply_text
from shared.redis_sockets import COMMAND_TIMEOUT_S, MAX_BLOCK_S
from shared.settings import Settings

log = logging.getLogger(__name__)

RUN_BATCH = "batches.runner.run_batch"  # the function name batch jobs carry in Redis (since before run_batch_job)
WAITING = (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED)
WORKER_TTL_S = 30  # rq's registration of a batch runner expires this long after its last heartbeat (at least)
RESULT_TTL_S = 24 * 3600


class JobNotAllowed(RuntimeError):
    """An rq job names a function that is not on the allow-list."""


def run_batch_job(batch_id: str, *, settings: Settings | None = None, heartbeat: Callable[[], None] | None = None,
                  stop: threading.Event | None = None) -> dict[str, Any]:
    """The rq job of a batch: run it; one this runner was asked to stop goes back in the queue. Returns what
    became of it (JSON)."""
    settings = settings or Settings.from_env()
    outcome = runner.run_batch(batch_id, settings, heartbeat=heartbeat, stop=stop)
    if outcome == "stopped":
        requeue_batch(settings, batch_id)
    return {"batch_id": batch_id, "outcome": outcome}


JOB_FUNCTIONS: dict[str, Callable[..., Any]] = {RUN_BATCH: run_batch_job}


class AllowListedJob(Job):
    """An rq job whose function can only be one of JOB_FUNCTIONS."""

    runtime: dict[str, Any] | None = None  # what the BatchWorker running it passes: settings, heartbeat, stop

    @property
    def func(self) -> Callable[..., Any]:
        """The allow-listed function this job runs (with the running worker's `runtime` keywords)."""
        name = self.func_name
        if self.instance is not None or name not in JOB_FUNCTIONS:
            raise JobNotAllowed(f"rq job {self.id} names {name!r}, which is not an allowed job function")
        return functools.partial(JOB_FUNCTIONS[name], **self.runtime) if self.runtime else JOB_FUNCTIONS[name]


class BatchWorker(SimpleWorker):
    """The rq worker of `llmfleet batch-runner`: runs batches in-process; SIGTERM requeues the current one."""

    settings: Settings | None = None  # what batches run with (None: read from the environment)
    stopping: threading.Event  # set on SIGTERM (warm shutdown): the running batch stops at its next check

    @property
    def dequeue_timeout(self) -> float:  # type: ignore[override]
        """How long one BLPOP for the next batch blocks: well under the socket timeout, which must not cut it."""
        return MAX_BLOCK_S

    @property
    def connection_timeout(self) -> float:  # type: ignore[override]
        """The socket timeout rq gives its connection when it has a shorter one: the main pools' own."""
        return COMMAND_TIMEOUT_S

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Run the job here (no fork), letting the batch keep rq's worker and job heartbeats fresh meanwhile
        (a SimpleWorker sends none while a job runs, and a batch runs for minutes or hours)."""
        execution = self.prepare_execution(job)
        job.runtime = {"settings": self.settings, "stop": self.stopping,
                       "heartbeat": lambda: self.maintain_heartbeats(job, execution)}
        self.perform_job(job, queue, execution)
        self.set_state(WorkerStatus.IDLE)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        """The worker's own TTL also while a batch runs (the batch sends a heartbeat every few seconds), so
        a runner killed mid-batch stops counting as alive (healthcheck) within WORKER_TTL_S."""
        return int(self.worker_ttl)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """Register this runner with SIGTERM already a warm shutdown (rq installs its handlers only after)."""
        # after, a SIGTERM in between killed it (exit -15), its registration left for the healthcheck to see
        self._install_signal_handlers()
        super().bootstrap(*args, **kwargs)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None,
                                     max_idle_time: int | None = None) -> tuple[Job, Queue] | None:
        """The next batch, waiting one BLMOVE (MAX_BLOCK_S) at a time; None once a stop is requested."""
        if timeout is None or max_idle_time is not None:  # burst mode, or the caller's own idle limit
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        while not self._stop_requested:  # rq's own loop waits for a job for ever, a stop request unseen
            result = super().dequeue_job_and_maintain_ttl(timeout, math.ceil(timeout))
            if result is not None:
                return result
        return None

    def request_stop(self, signum: Any, frame: Any) -> None:
        """Warm shutdown: a running batch stops at its next check and is requeued; an idle runner exits."""
        self.stopping.set()
        self._stop_requested = True
        with contextlib.suppress(StopRequested):
            # rq stops an idle worker by raising StopRequested wherever the signal landed: inside a log call it
            # was swallowed (logging's handleError) and the runner never exited; mid-pipeline it left unread
            # replies on a pooled connection, and deregistering on it failed (exit 1). The flag ends the loop.
            super().request_stop(signum, frame)


def batch_queue(connection: redis.Redis) -> Queue:
    """The rq queue of batches, JSON-serialized, with allow-listed jobs."""
    return Queue(keys.BATCH_QUEUE, connection=connection, serializer=JSONSerializer, job_class=AllowListedJob)


def batch_worker(connection: redis.Redis, name: str | None = None, ttl_s: int = WORKER_TTL_S,
                 settings: Settings | None = None) -> BatchWorker:
    """An rq worker for the batch queue (its registration expires ttl_s after its last heartbeat) running
    batches with `settings`."""
    worker = BatchWorker([batch_queue(connection)], connection=connection, serializer=JSONSerializer,
                         job_class=AllowListedJob, name=name, worker_ttl=ttl_s)
    worker.settings, worker.stopping = settings, threading.Event()
    return worker


def enqueue_batch(connection: redis.Redis, batch_id: str, attempt: int = 0) -> str:
    """Queue one rq job that runs (or resumes) the batch; its id is remembered in the batch's hash."""
    job_id = f"{batch_id}-{attempt}-{int(time.time() * 1000)}"
    connection.hset(keys.batch_key(batch_id), "rq_job", job_id)
    batch_queue(connection).enqueue(RUN_BATCH, batch_id, job_id=job_id, job_timeout=-1,
                                    result_ttl=RESULT_TTL_S, failure_ttl=RESULT_TTL_S,
                                    description=f"batch {batch_id}")
    return job_id


def requeue_batch(settings: Settings, batch_id: str) -> None:
    """Put a batch this runner stopped (SIGTERM) back in the queue; it is not counted as an attempt."""
    connection = sync_client(settings.redis_target)
    try:
        enqueue_batch(connection, batch_id)
        log.info("batch %s stopped and requeued", batch_id)
    finally:
        connection.close()


def recover_orphans(connection: redis.Redis, settings: Settings, suspects: dict[str, float],
                    now: float | None = None) -> list[str]:
    """Enqueue again the batches whose runner died; `suspects` remembers since when each looked orphaned."""
    now = time.time() if now is None else now
    queue = batch_queue(connection)
    recovered = []
    for raw in connection.smembers(keys.BATCHES_ACTIVE):
        batch_id = reply_text(raw)
        if connection.exists(keys.batch_lease(batch_id)):
            suspects.pop(batch_id, None)
            continue
        status, job_id = connection.hmget(keys.batch_key(batch_id), ["status", "rq_job"])
        if status is None or reply_text(status) in objects.TERMINAL_STATUSES:
            connection.srem(keys.BATCHES_ACTIVE, batch_id)
            continue
        job = queue.fetch_job(reply_text(job_id)) if job_id else None
        if job is not None and job.get_status() in WAITING:
            suspects.pop(batch_id, None)
            continue
        since = suspects.setdefault(batch_id, now)
        if now - since < settings.batch_lease_s:
            continue
        suspects.pop(batch_id, None)
        if not connection.set(keys.batch_lease(batch_id) + ":recovering", b"1", nx=True,
                              px=int(settings.batch_lease_s * 1000)):
            continue  # another runner is recovering it
        attempt = connection.hincrby(keys.batch_key(batch_id), "attempts", 1)
        enqueue_batch(connection, batch_id, attempt)
        log.warning("batch %s: its runner stopped renewing its lease; enqueued again (attempt %d)", batch_id, attempt)
        recovered.append(batch_id)
    return recovered
