"""One request through the scheduler without Redis: what `llmfleet generate` and engine tests run."""

from __future__ import annotations

from collections.abc import Iterator

from worker.engine.decode.generation import GenerationParams, TokenOutput
from worker.engine.engine import Engine
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, RequestFailed, SequenceStep


def generate(engine: Engine, prompt_ids: list[int], params: GenerationParams,
             config: SchedulerConfig | None = None) -> Iterator[TokenOutput]:
    """Generate one sequence, yielding each step's output until it finishes (the server's own loop)."""
    scheduler = Scheduler(engine, config or SchedulerConfig(max_sequences=1, max_queue=1))
    scheduler.add(GenerationRequest("local", list(prompt_ids), params))
    while scheduler.has_work:
        for event in scheduler.step():
            if isinstance(event, SequenceStep):
                yield event.output
            elif isinstance(event, RequestFailed):
                raise RuntimeError(event.message)
