"""gateway/http/tracing.py: the request span is named and described after its job (GenAI semantic conventions),
whose context the job carries; events add finish reasons, usage and errors; no text goes into a span."""

from __future__ import annotations

import time

import pytest

from gateway.http.tracing import note_event, traced
from shared import tracing
from shared.messages import ChatMessage, ChoiceEndEvent, DoneEvent, ErrorEvent, GenerateJob, Sampling, Usage
from tests.support.tracing import in_memory_tracer

pytest.importorskip("opentelemetry.sdk")


def _job() -> GenerateJob:
    now = time.time()
    return GenerateJob(id="req-1", model="m", created=now, deadline=now + 60, max_tokens=16, stream=True,
                       messages=[ChatMessage(role="user", content="a secret prompt")], stop=["secret stop"],
                       sampling=Sampling(temperature=0.5, seed=7))


def test_the_job_carries_the_request_spans_context(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = in_memory_tracer(monkeypatch)
    with tracing.tracer().start_as_current_span("POST /v1/chat/completions") as span:
        job = traced(_job())
        note_event(ChoiceEndEvent(id="req-1", seq=1, finish_reason="length"))
        note_event(DoneEvent(id="req-1", seq=2, usage=Usage(prompt_tokens=9, completion_tokens=16, total_tokens=25)))
    assert job.trace == tracing.traceparent(span)
    [finished] = exporter.get_finished_spans()
    assert finished.name == "chat m"
    attributes = finished.attributes
    assert attributes["gen_ai.request.max_tokens"] == 16 and attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (9, 16)
    assert not any("secret" in str(value) for value in attributes.values())


def test_an_error_marks_the_span(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = in_memory_tracer(monkeypatch)
    with tracing.tracer().start_as_current_span("POST /v1/completions"):
        note_event(ErrorEvent(id="r", seq=0, status=504, type="timeout", code="deadline_exceeded", message="late"))
    [finished] = exporter.get_finished_spans()
    assert finished.attributes["error.type"] == "deadline_exceeded" and not finished.status.is_ok


def test_tracing_off_leaves_the_job_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_tracer", None)
    job = _job()
    assert traced(job) is job
