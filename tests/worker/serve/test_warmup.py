"""A worker's warm-up requests: run through intake, scheduler and publisher, nothing sent, nothing counted."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import redis

from shared.messages import GenerateJob
from worker.loras import AdapterSet
from worker.schedule.encoder_scheduler import new_scheduler
from worker.schedule.scheduler import SchedulerConfig
from worker.serve.intake import JobIntake
from worker.serve.publisher import EventPublisher
from worker.serve.warmup import warm_up, warmup_jobs

COUNTERS = ("requests_received", "requests_finished", "prompt_tokens", "generated_tokens", "steps")


def _parts(engine: Any) -> tuple[JobIntake, Any, EventPublisher]:
    """Intake, scheduler and publisher over `engine`, with a Redis client that never connects."""
    client = redis.Redis(host="127.0.0.1", port=1)  # unused: a warm-up sends nothing
    scheduler = new_scheduler(engine, SchedulerConfig(max_sequences=4, max_batch_tokens=256, max_prefill_tokens=128))
    publisher = EventPublisher(client, engine.tokenizer, 60, model="tiny")
    intake = JobIntake(engine, scheduler, publisher, AdapterSet(engine.model, "tiny", max_count=1, max_bytes=1),
                       client, default_max_tokens=16)
    return intake, scheduler, publisher


@pytest.mark.parametrize("chat", [True, False])
def test_warm_up_runs_to_the_end_and_leaves_no_trace(tiny_chat_engine: Any, tiny_engine: Any, chat: bool) -> None:
    engine = tiny_chat_engine if chat else tiny_engine
    intake, scheduler, publisher = _parts(engine)
    jobs = warmup_jobs("tiny", embedding_only=False, chat=chat, worker_id="w1")
    assert all(isinstance(job, GenerateJob) and job.stream and job.stop for job in jobs)
    assert {job.sampling.temperature for job in jobs} == {0.0, 0.7}  # greedy and sampled paths both run
    before = dataclasses.asdict(scheduler.stats)
    took = warm_up(intake, scheduler, publisher, jobs)
    assert took > 0 and not scheduler.has_work
    assert publisher.backlog == 0 and not publisher._pending  # nothing queued to send
    after = dataclasses.asdict(scheduler.stats)
    assert {name: after[name] for name in COUNTERS} == {name: before[name] for name in COUNTERS}
    assert after["active"] == 0 and after["queue_depth"] == 0


def test_a_failing_warm_up_is_logged_not_raised(tiny_engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    intake, scheduler, publisher = _parts(tiny_engine)
    jobs = warmup_jobs("tiny", embedding_only=False, chat=True, worker_id="w1")  # no chat template: refused
    warm_up(intake, scheduler, publisher, jobs)
    assert not scheduler.has_work and not publisher._pending  # the refusals' error events are dropped too


def test_ids_cannot_be_a_clients() -> None:
    jobs = warmup_jobs("m", embedding_only=True, chat=False, worker_id="w9")
    assert [job.id for job in jobs] == ["warmup-w9-embed"]  # gateways name requests req-...
