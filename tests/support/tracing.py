"""An in-memory OpenTelemetry tracer standing in for shared/tracing.py's configured one, for unit tests (the real
OTLP/HTTP path is tested against tests/support/otlp_receiver.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shared import tracing


def in_memory_tracer(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make shared.tracing.tracer() a tracer whose spans end up in the returned InMemorySpanExporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    return exporter
