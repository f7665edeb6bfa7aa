"""shared/tracing.py: opt-in by the standard variables; a span's context as the traceparent a job carries, and
back; an untraced job's bytes are those of a worker that predates the field."""

from __future__ import annotations

import time

import msgspec
import pytest

from shared import codec, tracing
from shared.messages import EmbedJob, GenerateJob
from tests.support.tracing import in_memory_tracer

pytest.importorskip("opentelemetry.sdk")


def test_tracing_is_opt_in_by_the_otlp_endpoint() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})


def test_a_traceparent_names_its_span(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace

    in_memory_tracer(monkeypatch)
    with tracing.tracer().start_as_current_span("request") as span:
        parent = tracing.traceparent(span)
    assert parent is not None and parent.startswith("00-") and int(parent[-2:], 16) & 1  # sampled
    context = tracing.context_of(parent)
    assert trace.get_current_span(context).get_span_context().span_id == span.get_span_context().span_id
    assert tracing.context_of(None) is None and tracing.context_of("garbage") is None


def test_the_trace_travels_in_the_job_and_an_untraced_job_leaves_it_out() -> None:
    now = time.time()
    job = GenerateJob(id="r", model="m", created=now, deadline=now + 9, prompt="hi")
    assert "trace" not in msgspec.msgpack.decode(codec.encode_job(job))  # an older worker reads it
    traced = msgspec.structs.replace(job, trace="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    assert codec.decode_job(codec.encode_job(traced)) == traced
    assert codec.decode_job(codec.encode_job(job)) == job
    embed = EmbedJob(id="e", model="m", created=now, deadline=now + 9, inputs=["x"], trace="t")
    assert codec.decode_job(codec.encode_job(embed)).trace == "t"
