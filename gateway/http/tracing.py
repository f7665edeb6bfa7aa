"""The gateway's spans (shared/tracing.py; off unless OTEL_EXPORTER_OTLP_ENDPOINT is set): one SERVER span per API
request, renamed and described by the job it queues with the GenAI semantic conventions (`chat smollm2-135m`,
gen_ai.request.*, gen_ai.usage.*, gen_ai.response.*), whose context the job carries to the worker (`job.trace`).
Never a prompt, a stop string or a completion: ids, sizes, sampling numbers and timings only."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.tenants import current_tenant
from shared import tracing
from shared.messages import ChoiceEndEvent, DoneEvent, EmbedJob, ErrorEvent, Event, GenerateJob, Job

UNTRACED_PATHS = frozenset({"/health", "/ready", "/ready/gateway", "/metrics", "/dashboard", "/dashboard/fleet.json"})
PROVIDER = "llmfleet"


class TracingMiddleware:
    """A SERVER span around each request (but health, readiness, metrics and the dashboard), current while the app
    answers it, stream included; it notes the response's status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracer = tracing.tracer()
        if tracer is None or scope["type"] != "http" or scope["path"] in UNTRACED_PATHS:
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        # named by its method until a job names it (the path may hold ids: not a span name, HTTP semconv)
        with tracer.start_as_current_span(scope["method"], kind=SpanKind.SERVER, attributes=attributes) as span:
            async def send_noting_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                    if message["status"] >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, send_noting_status)


def traced(job: Job) -> Job:
    """`job` carrying the current request span's context (job.trace), the span named and described after it; the
    job itself when tracing is off or no request span is current."""
    if tracing.tracer() is None:
        return job
    from opentelemetry import trace

    span = trace.get_current_span()
    parent = tracing.traceparent(span)
    if parent is None or not isinstance(job, GenerateJob | EmbedJob):
        return job
    span.update_name(f"{operation(job)} {job.model}")
    span.set_attributes(request_attributes(job))
    return msgspec.structs.replace(job, trace=parent)


def operation(job: Job) -> str:
    """gen_ai.operation.name of a job."""
    if isinstance(job, EmbedJob):
        return "embeddings"
    return "chat" if isinstance(job, GenerateJob) and job.messages is not None else "text_completion"


def request_attributes(job: GenerateJob | EmbedJob) -> dict[str, Any]:
    """The GenAI semantic conventions' request attributes of a job (numbers and names only)."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation(job), "gen_ai.provider.name": PROVIDER,
                                  "gen_ai.request.model": job.model, "gen_ai.response.id": job.id,
                                  "llmfleet.priority": job.priority, "llmfleet.tenant": current_tenant()[0]}
    if isinstance(job, GenerateJob):
        sampling = job.sampling
        attributes |= {"gen_ai.request.temperature": sampling.temperature, "gen_ai.request.top_p": sampling.top_p,
                       "gen_ai.request.stream": job.stream, "gen_ai.request.choice.count": job.n}
        optional = {"gen_ai.request.max_tokens": job.max_tokens, "gen_ai.request.seed": sampling.seed,
                    "gen_ai.request.top_k": sampling.top_k or None,
                    "gen_ai.request.frequency_penalty": sampling.frequency_penalty or None,
                    "gen_ai.request.presence_penalty": sampling.presence_penalty or None}
        attributes |= {name: value for name, value in optional.items() if value is not None}
    return attributes


def note_event(event: Event) -> None:
    """Add what an event tells to the current request span: finish reasons, usage, an error's type."""
    if tracing.tracer() is None or not isinstance(event, ChoiceEndEvent | DoneEvent | ErrorEvent):
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = trace.get_current_span()
    if isinstance(event, ChoiceEndEvent):
        reasons = tuple((getattr(span, "attributes", None) or {}).get("gen_ai.response.finish_reasons", ()))
        span.set_attribute("gen_ai.response.finish_reasons", (*reasons, event.finish_reason))
    elif isinstance(event, DoneEvent):  # summed over a request's jobs (a completion of several prompts)
        known = getattr(span, "attributes", None) or {}
        span.set_attributes({"gen_ai.usage.input_tokens": known.get("gen_ai.usage.input_tokens", 0)
                             + event.usage.prompt_tokens,
                             "gen_ai.usage.output_tokens": known.get("gen_ai.usage.output_tokens", 0)
                             + event.usage.completion_tokens})
    else:
        span.set_attribute("error.type", event.code or event.type)
        span.set_status(Status(StatusCode.ERROR, event.type))
