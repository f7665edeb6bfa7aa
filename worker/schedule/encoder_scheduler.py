"""Batching for an embedding-only encoder (BERT): whole texts, many per forward, no KV pool.

The queue, priorities, cancellation and events are the Scheduler's; a step takes waiting inputs (best priority,
then arrival) while their tokens fit `max_batch_tokens` (one input always goes, up to the model's context),
encodes them in one forward and finishes each request whose inputs are all done.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from worker.engine.engine import Engine
from worker.schedule.admission import Admission
from worker.schedule.scheduler import Scheduler, StepEvent
from worker.schedule.scheduler_config import AUTO_MAX_SLOTS, SchedulerConfig
from worker.schedule.sequences import (
    EmbeddingDone,
    GenerationRequest,
    RequestGroup,
    ScheduledSequence,
    SchedulerStats,
    SeqState,
)

log = logging.getLogger(__name__)


class EncoderScheduler(Scheduler):
    """Drives an encoder engine: each step() embeds a batch of whole inputs in ONE forward."""

    def __init__(self, engine: Engine, config: SchedulerConfig | None = None) -> None:  # the base's, less the pool
        if not engine.embedding_only:
            raise ValueError("EncoderScheduler drives embedding-only engines; use Scheduler")
        config = config or SchedulerConfig()
        if config.max_sequences <= 0:
            config = replace(config, max_sequences=AUTO_MAX_SLOTS)
        self.engine = engine
        self.config = config
        self.kv_pool = None  # an encoder keeps nothing between steps
        self.blocks = None
        self.stats = SchedulerStats()
        self.admission = Admission(None, config, self.stats)
        self._groups: dict[str, RequestGroup] = {}
        self._arrivals = itertools.count()
        self._seq_ids = itertools.count()
        self._ready: list[StepEvent] = []

    def add(self, request: GenerationRequest) -> None:
        """An encoder cannot generate: always a ValueError."""
        raise ValueError("this model is an embedding model: it serves embeddings only, not completions or chat")

    def _check_input_fits(self, ids: list[int]) -> None:
        """An input must fit the model's context (an encoder holds no KV pool)."""
        self.engine.check_fits(len(ids), 0)

    def step(self, outranked: Callable[[int], bool] | None = None) -> list[StepEvent]:
        """Encode the next batch of waiting inputs in one forward; emit EmbeddingDone for finished requests
        (an encoder's step is one short forward: `outranked` is not asked)."""
        events: list[StepEvent] = self._ready
        self._ready = []
        batch = self._take_batch()
        if not batch:
            return events
        try:
            vectors = self.engine.embed_batch([seq.embed_ids for seq in batch],  # (B, D)
                                              normalize=[seq.group.request.normalize for seq in batch])
        except Exception as exc:  # the loop must survive anything one batch does
            log.exception("encoder forward failed; failing the requests of %d inputs", len(batch))
            for group in {id(seq.group): seq.group for seq in batch}.values():
                events.append(self._fail(group, f"engine error: {type(exc).__name__}"))
            self._refresh_gauges()
            return events
        self.stats.steps += 1
        now = time.monotonic()
        for seq, vector in zip(batch, vectors):
            self._finish_input(seq, vector, now, events)
        self._refresh_gauges()
        return events

    def _take_batch(self) -> list[ScheduledSequence]:
        """Pop waiting inputs, best first, while the batch stays within max_batch_tokens and max_sequences."""
        batch: list[ScheduledSequence] = []
        tokens = 0
        while (seq := self.admission.peek()) is not None and len(batch) < self.config.max_sequences:
            if batch and tokens + len(seq.embed_ids) > self.config.max_batch_tokens:
                break
            batch.append(self.admission.start_next())
            tokens += len(seq.embed_ids)
        return batch

    def _finish_input(self, seq: ScheduledSequence, vector: np.ndarray, now: float, events: list[StepEvent]) -> None:
        """Record one input's vector (D,); when it was its request's last, emit the request's EmbeddingDone."""
        if seq.state != SeqState.PREFILLING:  # its request failed or was cancelled meanwhile
            return
        seq.pooled = vector  # (D,)
        seq.computed = len(seq.embed_ids)
        seq.state = SeqState.FINISHED
        self.admission.retire(seq)
        self.stats.prompt_tokens += len(seq.embed_ids)
        group = seq.group
        if group.done:
            request = group.request
            group.timings.first_token = group.timings.finished = now
            self._groups.pop(request.request_id, None)
            self.stats.requests_finished += 1
            events.append(EmbeddingDone(request.request_id, [s.pooled.tolist() for s in group.sequences],
                                        len(request.prompt_ids), group.timings))

    def _refresh_gauges(self) -> None:
        """Queue depth, active inputs and tokens left (an encoder has no KV gauges)."""
        self.stats.queue_depth = self.admission.waiting_requests
        self.stats.active = len(self.admission.active)
        self.stats.tokens_left = sum(group.tokens_left for group in self._groups.values())


def new_scheduler(engine: Engine, config: SchedulerConfig | None = None) -> Scheduler:
    """The scheduler an engine needs: EncoderScheduler for an embedding-only model, else Scheduler."""
    return EncoderScheduler(engine, config) if engine.embedding_only else Scheduler(engine, config)
