"""A cancel at every moment of a job's life on the worker: before it is written, while it waits, while it is
being taken (read, not yet held), while it runs with the pub/sub notice lost. It never starts, or it stops at
once; real Redis, the tiny engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared import codec, keys
from shared.messages import CancelRequest, ChoiceEndEvent, DoneEvent, GenerateJob, Sampling, TokenEvent
from shared.settings import Settings
from tests.support.job_events import collect, submit
from worker.serve.runner import WorkerRunner

pytestmark = pytest.mark.integration
MODEL = "tiny"
LONG = 1500  # max_tokens no test lets run out


def _job(rid: str, max_tokens: int = LONG) -> GenerateJob:
    now = time.time()
    return GenerateJob(id=rid, model=MODEL, created=now, deadline=now + 60, prompt_token_ids=[5, 6, 7],
                       max_tokens=max_tokens, ignore_eos=True, sampling=Sampling(temperature=0.0))


def _mark(client: redis.Redis, rid: str) -> None:
    """What the gateway's cancel writes first: the marker (the publish may be lost)."""
    client.set(keys.cancelled_marker(MODEL, rid), b"1", ex=60)


@pytest.fixture()
def runner(tiny_engine: Any, client: redis.Redis, settings: Settings) -> Iterator[WorkerRunner]:
    """A worker, not started: a test may hook it before it runs."""
    worker = WorkerRunner(tiny_engine, client, settings, model=MODEL)
    yield worker
    worker.stop_requested.set()


def _serve(worker: WorkerRunner) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert worker.ready.wait(10)
    return thread


def _assert_cancelled(events: list[Any], *, started: bool) -> None:
    assert [e.finish_reason for e in events if isinstance(e, ChoiceEndEvent)] == ["cancelled"]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.usage.completion_tokens < LONG
    if not started:
        assert not [e for e in events if isinstance(e, TokenEvent)] and done.usage.completion_tokens == 0


def test_cancelled_before_the_job_is_written_never_starts(runner: WorkerRunner, client: redis.Redis) -> None:
    thread = _serve(runner)
    _mark(client, "before")
    _assert_cancelled(collect(submit(client, _job("before"))), started=False)
    assert runner.scheduler.stats.prompt_tokens == 0
    runner.stop_requested.set()
    thread.join(10)


def test_cancelled_while_queued_never_starts(runner: WorkerRunner, client: redis.Redis) -> None:
    pubsub = submit(client, _job("queued"))  # no worker yet: it waits in the stream
    _mark(client, "queued")
    client.publish(keys.cancel_channel(MODEL), codec.encode(CancelRequest(id="queued", model=MODEL, reason="t")))
    thread = _serve(runner)
    _assert_cancelled(collect(pubsub), started=False)
    runner.stop_requested.set()
    thread.join(10)


def test_cancelled_while_being_taken_stops_at_once(runner: WorkerRunner, client: redis.Redis) -> None:
    """The cancel lands after the take's marker check and before the job is held; its notice is lost."""
    real_add = runner.scheduler.add

    def add_then_cancel(request: Any) -> None:
        _mark(client, "taking")  # past the marker check, not yet held; no pub/sub notice reaches the worker
        real_add(request)

    runner.scheduler.add = add_then_cancel  # type: ignore[method-assign]
    thread = _serve(runner)
    _assert_cancelled(collect(submit(client, _job("taking"))), started=True)
    runner.stop_requested.set()
    thread.join(10)


def test_cancelled_while_running_with_the_notice_lost(runner: WorkerRunner, client: redis.Redis) -> None:
    thread = _serve(runner)
    pubsub = submit(client, _job("running"))
    first = None
    while first is None:  # it runs
        message = pubsub.get_message(timeout=5)
        if message and message["type"] == "message":
            first = codec.decode_event(message["data"])
    _mark(client, "running")  # the publish that follows it never arrives (e.g. a pub/sub reconnect)
    marked = time.monotonic()
    events = collect(pubsub)
    _assert_cancelled(events, started=True)
    assert time.monotonic() - marked < 2.0
    assert runner.scheduler.stats.active == 0
    runner.stop_requested.set()
    thread.join(10)


def test_marker_poll_names_only_marked_held_jobs(runner: WorkerRunner, client: redis.Redis) -> None:
    runner.cancels._held = lambda: ["a", "b", "c"]  # type: ignore[method-assign]
    _mark(client, "b")
    assert runner.cancels.poll_markers() == ["b"]
    assert runner.cancels.drain() == ["b"]
