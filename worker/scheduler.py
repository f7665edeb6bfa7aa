"""Continuous batching: admit by priority, chunked prefill beside decodes, KV budget with preemption."""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from worker.engine.engine import Engine
from worker.engine.kv_cache import SequenceKVCache
from worker.engine.model import BatchEntry
from worker.engine.prefix_cache import PrefixCache
from worker.engine.sequence import GenerationParams
from worker.sequences import (
    GenerationRequest,
    QueueFull,
    RequestDone,
    RequestFailed,
    RequestGroup,
    SchedulerStats,
    SeqState,
    Sequence,
    SequenceStep,
)

log = logging.getLogger(__name__)
StepEvent = SequenceStep | RequestDone | RequestFailed
MIB = 1 << 20


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduler."""

    max_sequences: int = 32  # sequences in one forward step
    max_batch_tokens: int = 2048  # tokens (decodes + prefill chunks) in one forward step
    max_prefill_tokens: int = 512  # largest prefill chunk of one sequence in one step
    max_queue: int = 256  # waiting requests before add() refuses
    kv_budget_mib: float = 1024.0  # KV cache of all active sequences
    prefix_cache_mib: float = 256.0  # separate budget of the prefix cache (0 = off)


class Scheduler:
    """Drives one engine: each step() runs ONE forward over every active sequence's new tokens."""

    def __init__(self, engine: Engine, config: SchedulerConfig | None = None) -> None:
        self.engine = engine
        self.config = config or SchedulerConfig()
        self.kv_budget = int(self.config.kv_budget_mib * MIB)
        self.prefix_cache = PrefixCache(int(self.config.prefix_cache_mib * MIB))
        self.stats = SchedulerStats()
        self._groups: dict[str, RequestGroup] = {}
        self._waiting: list[tuple[int, int, int, int, Sequence]] = []  # heap of (-priority, front, order, tie, seq)
        self._active: list[Sequence] = []
        self._arrivals = itertools.count()
        self._admissions = itertools.count()
        self._ties = itertools.count()

    # ---- submission -------------------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> None:
        """Queue a request; raises QueueFull at the bound and ValueError for one that can never run."""
        if request.request_id in self._groups:
            raise ValueError(f"duplicate request id {request.request_id}")
        if self.stats.queue_depth >= self.config.max_queue:
            raise QueueFull(f"{self.stats.queue_depth} requests are waiting (limit {self.config.max_queue})")
        if not request.prompt_ids:
            raise ValueError("the prompt is empty")
        if not 1 <= request.n <= self.config.max_sequences:
            raise ValueError(f"n must be between 1 and {self.config.max_sequences}")
        total = len(request.prompt_ids) + request.params.max_tokens
        self.engine.check_fits(len(request.prompt_ids), request.params.max_tokens)
        if SequenceKVCache.bytes_for(self.engine.model.config, total) > self.kv_budget:
            raise ValueError(f"{total} tokens do not fit this worker's KV budget of {self.config.kv_budget_mib} MiB")
        group = RequestGroup(request, next(self._arrivals))
        for index in range(request.n):
            gen = self.engine.new_generation(request.prompt_ids, self._choice_params(request, index))
            group.sequences.append(Sequence(group, index, gen))
        self._groups[request.request_id] = group
        self.stats.requests_received += 1
        self._push_waiting(group.sequences[0], front=False)
        for follower in group.sequences[1:]:
            follower.fork_from = group.sequences[0]
        self._refresh_gauges()

    @staticmethod
    def _choice_params(request: GenerationRequest, index: int) -> GenerationParams:
        """Choice i of a seeded request samples with seed + i, so choices differ yet stay reproducible."""
        sampling = request.params.sampling
        if index == 0 or sampling.seed is None:
            return request.params
        return replace(request.params, sampling=replace(sampling, seed=sampling.seed + index))

    def _push_waiting(self, seq: Sequence, *, front: bool) -> None:
        """Queue a sequence: by priority, preempted ones ahead of new arrivals, then by arrival."""
        seq.state = SeqState.PREEMPTED if front else SeqState.WAITING
        key = (-int(seq.group.request.priority), 0 if front else 1, seq.group.arrival, next(self._ties), seq)
        heapq.heappush(self._waiting, key)

    def cancel(self, request_id: str) -> RequestDone | None:
        """Cancel a request in any state; its slots and KV are freed at once. None if it is unknown or over."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return None
        group.cancelled = True
        tails = []
        for seq in group.sequences:
            ended = seq.state in (SeqState.FINISHED, SeqState.CANCELLED)
            tails.append("" if ended else seq.gen.finish("cancelled"))
            if not ended:
                seq.state = SeqState.CANCELLED
            self._free(seq)
        self._active = [s for s in self._active if s.group is not group]
        self._waiting = [item for item in self._waiting if item[-1].group is not group]
        heapq.heapify(self._waiting)
        self.stats.requests_cancelled += 1
        self._refresh_gauges()
        return self._done_event(group, tails)

    # ---- the step --------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """True while anything waits or runs."""
        return bool(self._waiting or self._active)

    def step(self) -> list[StepEvent]:
        """Admit, plan one batch within the token and KV budgets (preempting if needed), forward, sample."""
        self._admit()
        plan = self._plan()
        if not plan:
            return []
        events: list[StepEvent] = []
        try:
            outputs = self.engine.model.forward([BatchEntry(np.asarray(tokens), seq.cache) for seq, tokens in plan])
        except Exception as exc:  # the loop must survive anything one batch does
            log.exception("forward failed; failing the %d requests in the batch", len(plan))
            for group in {id(seq.group): seq.group for seq, _ in plan}.values():
                events.append(self._fail(group, f"engine error: {type(exc).__name__}"))
            return events
        self.stats.steps += 1
        now = time.monotonic()
        for (seq, _tokens), logits in zip(plan, outputs):
            if seq.group.cancelled or seq.pending_prefill > 0:
                continue
            if seq.state == SeqState.PREFILLING:
                self._on_prefill_done(seq, logits, now, events)
            else:
                self._on_logits(seq, logits, now, events)
        self._refresh_gauges()
        return events

    def _admit(self) -> None:
        """Move waiting sequences into free slots, best priority first, while their prompts fit the KV budget."""
        cfg = self.engine.model.config
        while self._waiting:
            seq = self._waiting[0][-1]
            group = seq.group
            shares = seq.index == 0 and not seq.was_preempted
            width = group.request.n if shares else 1
            need = width * SequenceKVCache.bytes_for(cfg, len(seq.target_ids) + 1)
            if len(self._active) + width > self.config.max_sequences:
                break
            if self._active and self._kv_in_use() + need > self.kv_budget:
                break
            heapq.heappop(self._waiting)
            if group.timings.admitted is None:
                group.timings.admitted = time.monotonic()
            seq.cache = self.engine.model.new_cache()
            seq.admit_order = next(self._admissions)
            if group.request.cache_prompt and self.prefix_cache.max_bytes > 0:
                restored = self.prefix_cache.restore(seq.target_ids, seq.cache)
                if not seq.was_preempted:
                    group.cached_tokens = restored
            seq.state = SeqState.PREFILLING
            self._active.append(seq)
            if shares:  # the other choices share this prefill and copy its KV when it is done
                for follower in group.sequences[1:]:
                    follower.state = SeqState.PREFILLING
                    follower.cache = self.engine.model.new_cache()
                    follower.admit_order = next(self._admissions)
                    self._active.append(follower)

    def _kv_in_use(self) -> int:
        """Bytes of KV held by active sequences."""
        return sum(s.cache.nbytes for s in self._active if s.cache is not None)

    def _plan(self) -> list[tuple[Sequence, list[int]]]:
        """Choose this step's tokens: every decode, then prefill chunks, within budgets; preempt to fit KV."""
        while True:
            plan: list[tuple[Sequence, list[int]]] = []
            budget = self.config.max_batch_tokens
            decoding = [s for s in self._active if s.state == SeqState.DECODING]
            prefilling = sorted((s for s in self._active if s.state == SeqState.PREFILLING and s.fork_from is None),
                                key=lambda s: (-int(s.group.request.priority), s.admit_order))
            for seq in decoding:
                if budget <= 0:
                    break
                plan.append((seq, [seq.gen.generated_ids[-1]]))
                budget -= 1
            for seq in prefilling:
                if budget <= 0:
                    break
                start = seq.cache.length
                chunk = min(seq.pending_prefill, self.config.max_prefill_tokens, budget)
                plan.append((seq, seq.target_ids[start : start + chunk]))
                budget -= chunk
            if self._fits(plan):
                for seq, tokens in plan:
                    seq.cache.reserve(seq.cache.length + len(tokens))
                self._refresh_gauges()
                return plan
            self._preempt_one()

    def _fits(self, plan: list[tuple[Sequence, list[int]]]) -> bool:
        """Whether the KV of all active sequences after this step (forks included) stays within budget."""
        cfg = self.engine.model.config
        growth = {id(seq): seq.cache.length + len(tokens) for seq, tokens in plan}
        total = 0
        for seq in self._active:
            if seq.fork_from is not None:
                total += SequenceKVCache.bytes_for(cfg, len(seq.group.request.prompt_ids))
            elif id(seq) in growth:
                total += max(seq.cache.nbytes, SequenceKVCache.bytes_for(cfg, growth[id(seq)]))
            else:
                total += seq.cache.nbytes
        return total <= self.kv_budget

    def _preempt_one(self) -> None:
        """Free the KV of the lowest-priority, most recently admitted sequence and requeue it at the front."""
        victims = [s for s in self._active if s.fork_from is None]
        if len(victims) <= 1 and not any(s.fork_from for s in self._active):
            raise RuntimeError("a single sequence exceeds the KV budget")  # add() prevents this
        victim = min(victims, key=lambda s: (int(s.group.request.priority), -s.admit_order))
        group_followers = [s for s in self._active if s.fork_from is victim]
        for seq in [victim, *group_followers]:
            self._free(seq)
            seq.fork_from = None
            seq.was_preempted = True
            self._active.remove(seq)
            self._push_waiting(seq, front=True)
        self.stats.preemptions += 1
        log.info("preempted request %s choice %d", victim.group.request.request_id, victim.index)

    def _on_prefill_done(self, seq: Sequence, logits: np.ndarray, now: float, events: list[StepEvent]) -> None:
        """The prompt is in the cache: store it for reuse, give forked choices a copy, sample."""
        group = seq.group
        if not seq.was_preempted and group.request.cache_prompt and self.prefix_cache.max_bytes > 0:
            self.prefix_cache.store(group.request.prompt_ids, seq.cache)
        if not seq.was_preempted:
            self.stats.prompt_tokens += len(group.request.prompt_ids)
        for follower in [s for s in self._active if s.fork_from is seq]:
            follower.cache.copy_prefix_from(seq.cache, seq.cache.length)
            follower.fork_from = None
            self._on_logits(follower, logits, now, events)
        self._on_logits(seq, logits, now, events)

    def _on_logits(self, seq: Sequence, logits: np.ndarray, now: float, events: list[StepEvent]) -> None:
        """Sample one token for a sequence, emit it, and retire the sequence if it finished."""
        seq.state = SeqState.DECODING
        out = seq.gen.accept_logits(logits)
        self.stats.generated_tokens += 1
        group = seq.group
        if group.timings.first_token is None:
            group.timings.first_token = now
        events.append(SequenceStep(group.request.request_id, seq.index, out))
        if out.finish_reason is not None:
            seq.state = SeqState.FINISHED
            self._free(seq)
            self._active.remove(seq)
            if group.done:
                group.timings.finished = now
                self._groups.pop(group.request.request_id, None)
                self.stats.requests_finished += 1
                events.append(self._done_event(group, []))

    def _done_event(self, group: RequestGroup, tails: list[str]) -> RequestDone:
        """The terminal record of a request."""
        return RequestDone(
            request_id=group.request.request_id,
            finish_reasons=[s.gen.finish_reason or "cancelled" for s in group.sequences],
            prompt_tokens=len(group.request.prompt_ids),
            completion_tokens=sum(len(s.gen.generated_ids) for s in group.sequences),
            cached_tokens=group.cached_tokens,
            timings=group.timings,
            seeds=[s.gen.seed for s in group.sequences],
            tail_texts=tails,
        )

    def _fail(self, group: RequestGroup, message: str) -> RequestFailed:
        """Drop a request after an engine failure."""
        for seq in group.sequences:
            seq.state = SeqState.CANCELLED
            self._free(seq)
        self._active = [s for s in self._active if s.group is not group]
        self._groups.pop(group.request.request_id, None)
        self.stats.requests_failed += 1
        return RequestFailed(group.request.request_id, message)

    @staticmethod
    def _free(seq: Sequence) -> None:
        """Release a sequence's KV buffers."""
        if seq.cache is not None:
            seq.cache.release()
            seq.cache = None

    def _refresh_gauges(self) -> None:
        """Update queue depth, active count and KV bytes (and the peak)."""
        self.stats.queue_depth = len({id(item[-1].group) for item in self._waiting if not item[-1].was_preempted})
        self.stats.active = len(self._active)
        self.stats.kv_bytes = self._kv_in_use()
        self.stats.kv_peak_bytes = max(self.stats.kv_peak_bytes, self.stats.kv_bytes)
