"""OpenTelemetry tracing, opt-in: on in a process that calls `configure` with OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, spans exported over OTLP/HTTP by the official SDK in batches.

The SDK reads the standard variables itself: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (the service name
defaults to `llmfleet-gateway` or `llmfleet-worker`), OTEL_EXPORTER_OTLP_{,TRACES_}{ENDPOINT,HEADERS,TIMEOUT},
OTEL_TRACES_SAMPLER and its _ARG, OTEL_BSP_* (the batch's delay and sizes) and OTEL_SDK_DISABLED. Without the
endpoint, or without the SDK installed (`pip install 'llmfleet[otel]'`), nothing is imported and nothing is traced.

The trace context crosses Redis inside the job (`GenerateJob.trace`, `EmbedJob.trace`: a W3C traceparent string);
`traceparent` and `context_of` turn a span into that string and back. Spans carry ids, sizes, timings and the
GenAI semantic conventions' attributes, never prompt or completion text.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_tracer: Any = None  # an opentelemetry Tracer once configured
_configured = False


def wanted(env: dict[str, str] | None = None) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint set and the SDK not disabled."""
    source = os.environ if env is None else env
    disabled = source.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    return not disabled and any(source.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def configure(service_name: str) -> bool:
    """Set up this process's tracer provider and OTLP/HTTP exporter when the environment asks for traces (once per
    process); True when tracing is on."""
    global _tracer, _configured
    if _configured:
        return _tracer is not None
    _configured = True
    if not wanted():
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed (%s); "
                    "pip install 'llmfleet[otel]' to export traces", exc)
        return False
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(named))  # merges OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # endpoint, headers from OTEL_* variables
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("llmfleet")
    log.info("tracing on: spans of %s go to the OTLP/HTTP endpoint of OTEL_EXPORTER_OTLP_*", service_name)
    return True


def tracer() -> Any:
    """This process's tracer, or None when tracing is off."""
    return _tracer


def flush(timeout_s: float = 5.0) -> None:
    """Export every span ended so far (a process about to exit; tests)."""
    if _tracer is not None:
        from opentelemetry import trace

        trace.get_tracer_provider().force_flush(int(timeout_s * 1000))  # type: ignore[attr-defined]


def traceparent(span: Any) -> str | None:
    """The W3C traceparent of a span (what a job carries across Redis), None for a span that is not recording."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def context_of(value: str | None) -> Any:
    """The OpenTelemetry context whose parent is the span a traceparent names; None when it names none."""
    if not value:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": value})
    from opentelemetry import trace

    return context if trace.get_current_span(context).get_span_context().is_valid else None
