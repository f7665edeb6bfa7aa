"""The worker's spans of a traced job (shared/tracing.py; a job carries its gateway span's context in `job.trace`).

Under the gateway's request span: `queue wait` (from the job's creation at the gateway to its taking here: gateway
and worker clocks), and `worker <model>` (from its taking to its end) with its children `admission` (waiting in
the scheduler for a slot and KV blocks), `prefill` (to the first token) and `decode` (to the last). They are
made when the job ends, with the scheduler's own timestamps, so nothing here runs inside a step; a job that ends
without a scheduler record (cancelled, refused, fenced off) gets its queue and worker spans only. Attributes are
the GenAI semantic conventions' usage and finish reasons, and ids: never text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from shared import tracing
from shared.messages import GenerateJob, Job
from worker.schedule.sequences import EmbeddingDone, RequestDone, RequestFailed


@dataclass
class _Traced:
    """What a traced job's spans need until it ends."""

    parent: Any  # the OpenTelemetry context of the gateway's span
    job: Job
    taken_ns: int


def _wall_ns(monotonic_s: float) -> int:
    """A time.monotonic() reading as unix nanoseconds."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class JobTracer:
    """Remembers the traced jobs a worker holds and writes their spans when they end (tracing on only)."""

    def __init__(self, model: str, worker_id: str) -> None:
        self.model = model
        self.worker_id = worker_id
        self._jobs: dict[str, _Traced] = {}

    def taken(self, job: Job) -> None:
        """A job was started here (or resumed): its spans will be written when it ends."""
        if tracing.tracer() is None or not getattr(job, "trace", None):
            return
        parent = tracing.context_of(job.trace)  # type: ignore[union-attr]
        if parent is not None:
            self._jobs[job.id] = _Traced(parent, job, time.time_ns())

    def observe(self, events: list[Any]) -> None:
        """Write the spans of the jobs a scheduler step ended, with the scheduler's timestamps."""
        if not self._jobs:
            return
        for event in events:
            if isinstance(event, RequestDone | RequestFailed | EmbeddingDone):
                traced = self._jobs.pop(event.request_id, None)
                if traced is not None:
                    self._write(traced, event)

    def ended(self, request_id: str) -> None:
        """A job ended without a scheduler record (cancelled, deadline, fenced off): its queue and worker spans."""
        traced = self._jobs.pop(request_id, None)
        if traced is not None:
            self._write(traced, None)

    def _write(self, traced: _Traced, event: Any) -> None:
        """The spans of one ended job."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        tracer, job, now = tracing.tracer(), traced.job, time.time_ns()
        created = min(int(job.created * 1e9), traced.taken_ns)  # the two clocks may disagree a little
        queue = tracer.start_span("queue wait", context=traced.parent, start_time=created,
                                  attributes={"llmfleet.priority": job.priority, "llmfleet.worker.id": self.worker_id})
        queue.end(end_time=traced.taken_ns)
        worker = tracer.start_span(f"worker {self.model}", context=traced.parent, kind=SpanKind.CONSUMER,
                                   start_time=traced.taken_ns, attributes=self._attributes(job, event))
        if isinstance(event, RequestFailed):
            worker.set_status(Status(StatusCode.ERROR))
        timings = getattr(event, "timings", None)
        if timings is not None:
            self._phases(tracer, worker, timings, traced.taken_ns)
        worker.end(end_time=max(now, traced.taken_ns))

    def _phases(self, tracer: Any, worker: Any, timings: Any, taken_ns: int) -> None:
        """admission, prefill and decode under the worker span, from the scheduler's monotonic timestamps."""
        from opentelemetry import trace

        context = trace.set_span_in_context(worker)
        marks = [timings.arrived, timings.admitted, timings.first_token, timings.finished]
        names = ("admission", "prefill", "decode")
        for name, start, end in zip(names, marks, marks[1:]):
            if start is None or end is None:
                break
            span = tracer.start_span(name, context=context, start_time=max(_wall_ns(start), taken_ns))
            span.end(end_time=max(_wall_ns(end), taken_ns))

    def _attributes(self, job: Job, event: Any) -> dict[str, Any]:
        """GenAI attributes of the worker span: model, usage, finish reasons (ids and numbers only)."""
        attributes: dict[str, Any] = {"gen_ai.request.model": job.model, "gen_ai.response.id": job.id,
                                      "llmfleet.worker.id": self.worker_id}
        if isinstance(job, GenerateJob):
            attributes["gen_ai.operation.name"] = "chat" if job.messages is not None else "text_completion"
        else:
            attributes["gen_ai.operation.name"] = "embeddings"
        if isinstance(event, RequestDone):
            attributes |= {"gen_ai.usage.input_tokens": event.prompt_tokens,
                           "gen_ai.usage.output_tokens": event.completion_tokens,
                           "llmfleet.cached_tokens": event.cached_tokens,
                           "gen_ai.response.finish_reasons": list(event.finish_reasons)}
        elif isinstance(event, EmbeddingDone):
            attributes["gen_ai.usage.input_tokens"] = event.prompt_tokens
        return attributes
