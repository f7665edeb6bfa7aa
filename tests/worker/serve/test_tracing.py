"""worker/serve/tracing.py: a traced job's queue, worker, admission, prefill and decode spans, under the gateway's
span its job names, written when it ends; an untraced job costs nothing and writes none."""

from __future__ import annotations

import time
from typing import Any

import pytest

from shared import tracing
from shared.messages import GenerateJob
from tests.support.tracing import in_memory_tracer
from worker.schedule.sequences import RequestDone, RequestTimings
from worker.serve.tracing import JobTracer

pytest.importorskip("opentelemetry.sdk")


def _job(trace: str | None) -> GenerateJob:
    now = time.time()
    return GenerateJob(id="r1", model="m", created=now - 0.05, deadline=now + 60, prompt="secret words", trace=trace)


def _taken_under_a_gateway_span(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, JobTracer]:
    """An in-memory exporter, a gateway span, and a worker's tracer that took a job traced under that span."""
    exporter = in_memory_tracer(monkeypatch)
    with tracing.tracer().start_as_current_span("chat m") as gateway:
        parent = tracing.traceparent(gateway)
    tracer = JobTracer("m", "w1")
    tracer.taken(_job(parent))
    return exporter, gateway, tracer


def test_a_traced_jobs_spans_nest_under_its_gateway_span(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, gateway, tracer = _taken_under_a_gateway_span(monkeypatch)
    start = time.monotonic()
    timings = RequestTimings(arrived=start, admitted=start + 0.001, first_token=start + 0.01, finished=start + 0.02)
    tracer.observe([RequestDone("r1", ["stop"], 5, 3, 0, timings, [1])])
    tracer.ended("r1")  # already written: nothing more
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"chat m", "queue wait", "worker m", "admission", "prefill", "decode"}
    gateway_id, worker = gateway.get_span_context().span_id, spans["worker m"]
    assert spans["queue wait"].parent.span_id == worker.parent.span_id == gateway_id
    assert all(spans[p].parent.span_id == worker.context.span_id for p in ("admission", "prefill", "decode"))
    assert spans["prefill"].end_time <= spans["decode"].start_time + 1000
    assert worker.attributes["gen_ai.usage.output_tokens"] == 3
    assert worker.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert not any("secret" in str(v) for s in spans.values() for v in s.attributes.values())


def test_a_job_ended_outside_the_scheduler_gets_its_queue_and_worker_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, gateway, tracer = _taken_under_a_gateway_span(monkeypatch)
    tracer.ended("r1")  # cancelled
    assert sorted(s.name for s in exporter.get_finished_spans()) == ["chat m", "queue wait", "worker m"]


def test_untraced_jobs_write_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = in_memory_tracer(monkeypatch)
    tracer = JobTracer("m", "w1")
    tracer.taken(_job(None))
    tracer.ended("r1")
    assert not exporter.get_finished_spans()
    monkeypatch.setattr(tracing, "_tracer", None)  # tracing off: a traced job is not even remembered
    tracer.taken(_job("00-" + "1" * 32 + "-" + "2" * 16 + "-01"))
    assert not tracer._jobs
