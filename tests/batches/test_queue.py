"""rq for batches against a real Redis: JSON jobs, the allow-list, and the recovery of orphaned batches."""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.job import JobStatus

from batches import queue as batch_queue_module
from batches.queue import AllowListedJob, batch_queue, batch_worker, enqueue_batch, recover_orphans
from batches.redis_clients import sync_client
from shared import keys
from shared.redis_sockets import COMMAND_TIMEOUT_S
from shared.settings import Settings

pytestmark = pytest.mark.integration

SETTINGS = Settings(batch_lease_s=5.0)


def make_batch(connection: redis.Redis, batch_id: str, status: str = "in_progress") -> None:
    connection.hset(keys.batch_key(batch_id), mapping={"id": batch_id, "status": status, "attempts": 0})
    connection.sadd(keys.BATCHES_ACTIVE, batch_id)


def test_a_batch_job_is_stored_as_json_naming_the_allowed_function(sredis: redis.Redis) -> None:
    job_id = enqueue_batch(sredis, "batch_abc")
    assert sredis.hget(keys.batch_key("batch_abc"), "rq_job").decode() == job_id
    stored = json.loads(zlib.decompress(sredis.hget(f"rq:job:{job_id}", "data")))  # JSON (zlib'd by rq), not pickle
    assert stored[0] == "batches.runner.run_batch" and stored[2] == ["batch_abc"]
    job = batch_queue(sredis).fetch_job(job_id)
    assert isinstance(job, AllowListedJob) and job.func is batch_queue_module.run_batch_job and job.get_status() == JobStatus.QUEUED


def test_a_job_naming_another_function_fails_without_running(sredis: redis.Redis, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = batch_queue(sredis).enqueue("pathlib.Path.touch", str(marker))
    batch_worker(sredis).work(burst=True)
    job.refresh()
    assert job.get_status() == JobStatus.FAILED and not marker.exists()
    assert "not an allowed job function" in (job.latest_result().exc_string or "")


def test_a_pickled_job_is_never_unpickled(sredis: redis.Redis, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    pickled = Queue(keys.BATCH_QUEUE, connection=sredis)  # rq's default serializer is pickle
    job = pickled.enqueue("pathlib.Path.touch", str(marker))
    batch_worker(sredis).work(burst=True)  # the JSON serializer cannot read it: DeserializationError
    assert sredis.hget(f"rq:job:{job.id}", "status") == b"failed" and not marker.exists()


def test_orphaned_batches_are_enqueued_again_after_the_lease_time(sredis: redis.Redis) -> None:
    make_batch(sredis, "batch_waiting")
    enqueue_batch(sredis, "batch_waiting")  # queued, no runner free yet: not an orphan
    make_batch(sredis, "batch_leased")
    sredis.set(keys.batch_lease("batch_leased"), "runner-1", px=5000)
    make_batch(sredis, "batch_orphan")
    job = batch_queue(sredis).fetch_job(enqueue_batch(sredis, "batch_orphan"))
    job.set_status(JobStatus.STARTED)  # its runner took it, then died (no lease renewed)
    make_batch(sredis, "batch_done", status="completed")
    suspects: dict[str, float] = {}

    assert recover_orphans(sredis, SETTINGS, suspects, now=1000.0) == []
    assert set(suspects) == {"batch_orphan"}
    assert not sredis.sismember(keys.BATCHES_ACTIVE, "batch_done")
    assert recover_orphans(sredis, SETTINGS, suspects, now=1004.0) == []  # within the lease time
    assert recover_orphans(sredis, SETTINGS, suspects, now=1005.5) == ["batch_orphan"]
    assert sredis.hget(keys.batch_key("batch_orphan"), "attempts") == b"1"
    requeued = batch_queue(sredis).fetch_job(sredis.hget(keys.batch_key("batch_orphan"), "rq_job").decode())
    assert requeued.get_status() == JobStatus.QUEUED and requeued.args == ["batch_orphan"]
    assert recover_orphans(sredis, SETTINGS, suspects, now=1100.0) == []  # queued again: waits for a runner


def test_a_runner_that_stops_puts_its_batch_back_without_counting_an_attempt(
        sredis: redis.Redis, redis_server: Any) -> None:
    make_batch(sredis, "batch_x")
    batch_queue_module.requeue_batch(Settings(redis_url=redis_server.url), "batch_x")
    job = batch_queue(sredis).fetch_job(sredis.hget(keys.batch_key("batch_x"), "rq_job").decode())
    assert job.get_status() == JobStatus.QUEUED
    assert sredis.hget(keys.batch_key("batch_x"), "attempts") == b"0"


def test_a_running_batch_gets_the_workers_heartbeat_settings_and_stop_event(
        sredis: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def probe(*, settings: Settings | None, heartbeat: Any, stop: Any) -> None:
        seen.append({"settings": settings, "stop": stop})
        heartbeat()  # what BatchRun does at every check

    monkeypatch.setitem(batch_queue_module.JOB_FUNCTIONS, "probe", probe)
    job = batch_queue(sredis).enqueue("probe")
    worker = batch_worker(sredis, settings=SETTINGS)
    worker.work(burst=True)
    assert seen == [{"settings": SETTINGS, "stop": worker.stopping}]
    assert batch_queue(sredis).fetch_job(job.id).get_status() == JobStatus.FINISHED


def test_the_runners_client_fails_a_held_command_within_the_timeout_and_its_wait_for_a_batch_is_not_cut(
        proxied_redis: Any) -> None:
    _url, proxy = proxied_redis
    connection = sync_client(f"redis://127.0.0.1:{proxy.port}/0")
    worker = batch_worker(connection)
    assert connection.connection_pool.connection_kwargs["socket_timeout"] == COMMAND_TIMEOUT_S  # rq kept ours
    proxy.set_rtt(0.05)  # a Redis in another zone: the BLPOP blocks its whole time and ends normally
    started = time.monotonic()
    with pytest.raises(DequeueTimeout):
        Queue.dequeue_any([batch_queue(connection)], worker.dequeue_timeout, connection=connection)
    assert worker.dequeue_timeout <= time.monotonic() - started < COMMAND_TIMEOUT_S
    proxy.set_rtt(0.0)
    connection.set("k", b"v")
    proxy.hold_open()  # a partition that lost the open connections' packets
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError):
        connection.get("k")
    assert time.monotonic() - started < COMMAND_TIMEOUT_S + 1.5  # one timeout (not retried), not TCP's minutes
    assert connection.get("k") == b"v"  # the next command dials afresh
    connection.close()
