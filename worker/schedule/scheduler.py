"""Continuous batching: each step schedules one batch (every decode, then prefill chunks, within the token and KV
budgets: a SchedulerOutput), executes one forward and updates its sequences from the rows: tokens, embeddings and
events. Who waits, who runs and who is preempted is worker/schedule/admission.py's."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from shared.errors import QueueFull
from worker.engine import ops
from worker.engine.decode.batch_sampling import SampledToken, sample_batch
from worker.engine.embeddings import finish_pool, pool_chunk
from worker.engine.engine import Engine
from worker.engine.errors import StepInterrupted
from worker.engine.kv.tier_link import open_tier
from worker.engine.text.constraints import ConstraintError
from worker.engine.text.stopping import StopReason
from worker.schedule.admission import Admission
from worker.schedule.hybrid import prefill_chunk
from worker.schedule.pool_sizing import sized_pool
from worker.schedule.preemption import TOP_RANK, not_outranked, rank
from worker.schedule.prompt_scoring import PromptScored, PromptScorer
from worker.schedule.scheduler_config import SchedulerConfig
from worker.schedule.scheduler_output import SchedulerOutput
from worker.schedule.sequences import (
    EmbeddingDone,
    EmbeddingRequest,
    GenerationRequest,
    RequestDone,
    RequestFailed,
    RequestGroup,
    ScheduledSequence,
    SchedulerStats,
    SeqState,
    SequenceStep,
)
from worker.schedule.suspension import HeldStep

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerOutput", "StepEvent"]

log = logging.getLogger(__name__)


StepEvent = SequenceStep | RequestDone | RequestFailed | EmbeddingDone | PromptScored


class Scheduler:
    """Drives one engine: each step() runs ONE forward over every active sequence's new tokens."""

    def __init__(self, engine: Engine, config: SchedulerConfig | None = None) -> None:
        self.engine = engine
        self.kv_pool, config = sized_pool(engine.model, config or SchedulerConfig())
        self.config = config
        self.blocks = self.kv_pool.blocks
        self.stats = SchedulerStats(kv_blocks_total=self.kv_pool.n_blocks)
        self.tier = open_tier(self.kv_pool, engine.source, config.kv_tier_dir, config.kv_tier_mib)
        self.admission = Admission(self.blocks, config, self.stats, self.tier, self.kv_pool.states)
        self._groups: dict[str, RequestGroup] = {}
        self._arrivals = itertools.count()
        self._seq_ids = itertools.count()
        self._ready: list[StepEvent] = []  # events that need no forward (a resumed request already complete)
        self.held = HeldStep()  # a step stopped for an outranking arrival, to go on after its prefill

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
        if self.blocks.blocks_for(total) > self.kv_pool.n_blocks:
            raise ValueError(f"{total} tokens do not fit this worker's KV pool of {self.kv_pool.capacity_tokens} tokens")
        group = RequestGroup(request, next(self._arrivals))
        if request.prompt_logprobs is not None:
            group.scorer = PromptScorer(request.prompt_ids, request.prompt_logprobs)
        for index in range(request.n):
            gen = self.engine.new_generation(request.prompt_ids, request.choice_params(index))
            group.sequences.append(ScheduledSequence(group, index, gen, next(self._seq_ids)))
        self._groups[request.request_id] = group
        self.stats.requests_received += 1
        if request.resume_tokens is not None:
            self._resume(group)
        else:
            self.admission.push(group.sequences[0], front=False)
            for follower in group.sequences[1:]:
                follower.fork_from = group.sequences[0]
        self._refresh_gauges()

    def _resume(self, group: RequestGroup) -> None:
        """Continue another worker's request: replay each choice's sent tokens (GenerationState.replay), then
        queue what is unfinished; each choice prefills prompt + its tokens alone (prompt blocks shared)."""
        request = group.request
        for seq, tokens in zip(group.sequences, request.resume_tokens):
            gen = seq.gen
            gen.replay(tokens)
            if seq.index in request.resume_ended or gen.finish_reason is not None:
                gen.finish_reason = gen.finish_reason or StopReason.STOP
                seq.state = SeqState.FINISHED
            else:
                seq.was_preempted = True  # its prompt was counted by the first worker; it prefills alone
                self.admission.push(seq, front=False)
        if group.done:  # every choice had ended: only the terminal event was missing
            self._groups.pop(request.request_id, None)
            self.stats.requests_finished += 1
            self._ready.append(group.done_event([]))

    def add_embedding(self, request: EmbeddingRequest) -> None:
        """Queue an embedding request: each input is prefilled (chunked, batched with other work), then pooled."""
        if request.request_id in self._groups:
            raise ValueError(f"duplicate request id {request.request_id}")
        if self.stats.queue_depth >= self.config.max_queue:
            raise QueueFull(f"{self.stats.queue_depth} requests are waiting (limit {self.config.max_queue})")
        if not request.inputs or not all(request.inputs):
            raise ValueError("cannot embed an empty input")
        for ids in request.inputs:
            self._check_input_fits(ids)
        group = RequestGroup(request, next(self._arrivals))
        for index, ids in enumerate(request.inputs):
            group.sequences.append(ScheduledSequence(group, index, None, next(self._seq_ids), embed_ids=list(ids)))
        self._groups[request.request_id] = group
        self.stats.requests_received += 1
        for seq in group.sequences:
            self.admission.push(seq, front=False)
        self._refresh_gauges()

    def _check_input_fits(self, ids: list[int]) -> None:
        """An embedding input must fit the model's context and this worker's KV pool (ValueError otherwise)."""
        self.engine.check_fits(len(ids), 0)
        if self.blocks.blocks_for(len(ids)) > self.kv_pool.n_blocks:
            raise ValueError(f"{len(ids)} tokens do not fit this worker's KV pool")

    def cancel(self, request_id: str) -> RequestDone | None:
        """Cancel a request in any state; its slots and KV blocks are freed at once.

        Returns the terminal record of a generation; None for an embedding, or a request unknown or over.
        """
        group = self._groups.pop(request_id, None)
        if group is None:
            return None
        group.cancelled = True
        tails = []
        for seq in group.sequences:
            ended = seq.state in (SeqState.FINISHED, SeqState.CANCELLED)
            tails.append("" if ended or seq.gen is None else seq.gen.finish(StopReason.CANCELLED))
            if not ended:
                seq.state = SeqState.CANCELLED
        self.admission.drop_group(group)
        self.stats.requests_cancelled += 1
        self._refresh_gauges()
        if isinstance(group.request, EmbeddingRequest):
            return None  # an embedding has no partial result to report
        return group.done_event(tails)

    # ---- the step --------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """True while anything waits or runs."""
        return bool(self.admission.waiting or self.admission.active or self._ready)

    def step(self, outranked: Callable[[int], bool] | None = None) -> list[StepEvent]:
        """One step in three phases (as vLLM's): schedule a batch, execute its forward, update from the outputs.
        `outranked(rank)`, asked between layers, is True once a request ranked above `rank` (the step's lowest) has
        arrived: the step stops and is held, the next prefills the arrival first (issue 25), and the held one then
        goes on from the layer it stopped at (worker/schedule/suspension.py)."""
        events, self._ready = self._ready, []  # events that needed no forward go first
        if (scheduled := self.schedule()) is not None and (outputs := self.execute(scheduled, outranked, events)):
            self.update(scheduled, outputs, events)
        return events

    def schedule(self) -> SchedulerOutput | None:
        """Admit, then go on with a held step or plan one batch within the token and KV budgets (preempting if
        needed); None: nothing runs."""
        self.admission.admit()
        if (held := self.held.take(self.admission.active)) is not None:
            return held
        return SchedulerOutput.of(plan) if (plan := self._plan()) else None

    def execute(self, scheduled: SchedulerOutput, outranked: Callable[[int], bool] | None,
                events: list[StepEvent]) -> list[np.ndarray | None] | None:
        """The step's one forward; None when an arrival that outranks it stopped it (held or undone) or it failed."""
        floor, model = scheduled.floor, self.engine.model
        interrupt = None if outranked is None or floor >= TOP_RANK else (lambda: outranked(floor))
        try:
            if scheduled.resume is not None:
                return model.resume(scheduled.resume, self.kv_pool, interrupt)
            return model.forward(scheduled.entries, self.kv_pool, interrupt)
        except StepInterrupted as stop:
            self.stats.interrupted_steps += 1
            if not self.held.hold(scheduled, stop.suspended):
                self.admission.undo_step(scheduled.sequences)
            self._refresh_gauges()
            return None
        except Exception as exc:  # the loop must survive anything one batch does
            log.exception("forward failed; failing the %d requests in the batch", len(scheduled.plan))
            for group in {id(seq.group): seq.group for seq in scheduled.sequences}.values():
                events.append(self._fail(group, f"engine error: {type(exc).__name__}"))
            return None

    def update(self, scheduled: SchedulerOutput, outputs: list[np.ndarray | None], events: list[StepEvent]) -> None:
        """The forward's rows into tokens, embeddings and events (drafts verified, prompts scored, rows sampled)."""
        self.stats.steps += 1
        now = time.monotonic()
        rows: list[tuple[ScheduledSequence, np.ndarray]] = []  # (sequence, its logits) to sample this step
        for (seq, tokens), logits in zip(scheduled.plan, outputs):
            if seq.state == SeqState.DECODING and len(tokens) > 1:
                self._verify(seq, tokens, logits, now, events)
                continue
            start = seq.computed
            self._computed(seq, len(tokens))
            if seq.gen is None:
                self._on_hidden(seq, logits, now, events)
                continue
            if logits.ndim == 2:  # every row of a scored prompt's prefill chunk; the last one samples
                logits = seq.group.score_chunk(start, logits, events)
            if seq.group.cancelled or seq.pending_prefill > 0 or seq.state == SeqState.FINISHED:
                continue  # (finished: a scoring-only choice its group's other prefill ended this step)
            if seq.state == SeqState.PREFILLING and seq.group.request.params.max_tokens == 0:
                self._end_unsampled(seq.group, now, events)  # scoring only: no token is sampled
            elif seq.state == SeqState.PREFILLING:
                rows.extend(self._on_prefill_done(seq, logits))
            else:
                rows.append((seq, logits))
        if rows:
            self._sample(rows, now, events)
        self._refresh_gauges()

    def _sample(self, rows: list[tuple[ScheduledSequence, np.ndarray]], now: float, events: list[StepEvent]) -> None:
        """Sample every row of the step in one vectorised pass, then let each sequence take its token."""
        gens = [seq.gen for seq, _ in rows]
        try:
            sampled = sample_batch([g.sampler for g in gens], [logits for _, logits in rows],
                                   [g.prompt_ids for g in gens], [g.generated_ids for g in gens],
                                   [g.constraint for g in gens])
        except ValueError:  # one row cannot be sampled (e.g. every token banned): find it, sample the rest alone
            sampled = []
            for gen, (seq, logits) in zip(gens, rows):
                try:
                    sampled.append(None if seq.state == SeqState.CANCELLED else gen.sample(logits))
                except ValueError as exc:
                    events.append(self._fail(seq.group, f"sampling failed: {exc}"))
                    sampled.append(None)
        for (seq, _), token in zip(rows, sampled):
            if token is not None and not seq.group.cancelled and seq.state != SeqState.CANCELLED:
                self._on_token(seq, token, now, events)

    def _on_hidden(self, seq: ScheduledSequence, hidden: np.ndarray, now: float, events: list[StepEvent]) -> None:
        """Pool an embedding input's final hidden states (T, D) chunk by chunk; finish it after its last chunk."""
        request = seq.group.request
        assert isinstance(request, EmbeddingRequest)
        seq.pooled = pool_chunk(seq.pooled, hidden, request.pooling)  # (D,)
        if seq.pending_prefill > 0:
            return
        seq.pooled = finish_pool(seq.pooled, len(seq.embed_ids), request.pooling, request.normalize)  # (D,)
        seq.state = SeqState.FINISHED
        self.admission.retire(seq)
        self.stats.prompt_tokens += len(seq.embed_ids)
        group = seq.group
        if group.done:
            group.timings.first_token = group.timings.finished = now
            self._groups.pop(request.request_id, None)
            self.stats.requests_finished += 1
            events.append(EmbeddingDone(request.request_id, [s.pooled.tolist() for s in group.sequences],
                                        len(request.prompt_ids), group.timings))

    def _computed(self, seq: ScheduledSequence, n: int) -> None:
        """Record n more tokens in the pool; blocks that became full join the prefix cache."""
        size, before = self.blocks.block_size, seq.computed
        seq.computed += n
        full = seq.computed // size > before // size  # the host tier also takes a partly filled block's rows
        if seq.group.request.cache_prompt and (full or self.tier is not None):
            self.admission.commit(seq)

    def _plan(self) -> list[tuple[ScheduledSequence, list[int]]]:
        """Choose this step's tokens: every decode, then prefill chunks, within budgets; preempt to fit KV."""
        active, held = self.admission.active, self.held.seq_ids  # a held step's sequences sit out
        decoding = not_outranked(self.admission.make_room_for_decodes(held), active)  # an outranking prefill: alone
        plan: list[tuple[ScheduledSequence, list[int]]] = []
        budget = self.config.max_batch_tokens
        prefilling = sorted(not_outranked([s for s in active if s.state == SeqState.PREFILLING
                                           and s.fork_from is None and s.seq_id not in held], active),
                            key=lambda s: (-rank(s), s.admit_order))
        speculate = (self.config.speculative_tokens > 0 and len(decoding) <= self.config.speculative_max_batch
                     and not prefilling  # drafts never delay a prompt's prefill (TTFT)
                     and self.kv_pool.states is None)  # a recurrent state cannot take back a rejected draft
        spare = self.blocks.num_free_blocks - sum(self.blocks.append_cost(s.seq_id, 1) for s in decoding)
        draft_rows = max(0, ops.narrow_rows() - len(decoding))  # drafts never widen the step past narrow
        for seq in decoding[:budget]:
            drafts = seq.draft_tokens(self.config.speculative_tokens, min(budget, draft_rows + 1),
                                      self.engine.context_length) if speculate else []
            draft_rows -= len(drafts)
            extra = self.blocks.append_cost(seq.seq_id, 1 + len(drafts)) - self.blocks.append_cost(seq.seq_id, 1)
            if extra > spare:  # drafts never take blocks a plain decode needs
                drafts, extra = [], 0
            spare -= extra
            self.kv_pool.extend(seq.seq_id, 1 + len(drafts))
            plan.append((seq, [seq.gen.generated_ids[-1], *drafts]))
            budget -= 1 + len(drafts)
        for seq in prefilling:
            if budget <= 0:
                break
            chunk = prefill_chunk(seq, min(self.config.max_prefill_tokens, budget), self.kv_pool)
            plan.append((seq, seq.target_ids[seq.computed : seq.computed + chunk]))
            budget -= chunk
        self._refresh_gauges()
        return plan

    def _verify(self, seq: ScheduledSequence, tokens: list[int], logits: np.ndarray, now: float,
                events: list[StepEvent]) -> None:
        """Keep drafted tokens while each equals what the sampler picks after the one before; drop the rest."""
        gen, start = seq.gen, seq.computed
        self.stats.speculated_tokens += len(tokens) - 1
        for row in range(len(tokens)):
            sampled = gen.sample(logits[row])  # a constrained row is masked by its matcher in this exact state
            self._on_token(seq, sampled, now, events)
            if seq.state != SeqState.DECODING:  # finished: its blocks are already freed
                return
            if row + 1 < len(tokens) and sampled.token_id == tokens[row + 1]:
                self.stats.accepted_tokens += 1
                continue
            break
        if seq.proposer is not None and len(tokens) > 1:
            seq.proposer.record(kept=row, rejected=row + 1 < len(tokens))
        self.blocks.truncate(seq.seq_id, start + row + 1)  # KV of tokens[0..row] is right; the rest is dropped
        self._computed(seq, row + 1)

    def _on_prefill_done(self, seq: ScheduledSequence,
                         logits: np.ndarray) -> list[tuple[ScheduledSequence, np.ndarray]]:
        """The prompt is in the pool: forked choices share its blocks; every choice samples from its logits."""
        group = seq.group
        if not seq.was_preempted:
            self.stats.prompt_tokens += len(group.request.prompt_ids)
        rows = []
        for follower in [s for s in self.admission.active if s.fork_from is seq]:
            self.kv_pool.fork(seq.seq_id, follower.seq_id)
            follower.holds_blocks, follower.computed = True, seq.computed
            follower.fork_from = None
            rows.append((follower, logits))
        return [*rows, (seq, logits)]

    def _end_unsampled(self, group: RequestGroup, now: float, events: list[StepEvent]) -> None:
        """End every choice of a prefilled max_tokens-0 request with 'length', no token sampled (echo scoring)."""
        self.stats.prompt_tokens += len(group.request.prompt_ids)
        for seq in group.sequences:
            seq.gen.finish(StopReason.LENGTH)
            seq.state = SeqState.FINISHED
        self.admission.drop_group(group)
        group.timings.first_token = group.timings.finished = now
        self._groups.pop(group.request.request_id, None)
        self.stats.requests_finished += 1
        events.append(replace(group.done_event([]), unsampled=True))

    def _on_token(self, seq: ScheduledSequence, sampled: SampledToken, now: float, events: list[StepEvent]) -> None:
        """Give a sequence its sampled token, emit it, and retire the sequence if it finished."""
        seq.state = SeqState.DECODING
        group = seq.group
        try:
            out = seq.gen.accept(sampled)
        except ConstraintError as exc:  # the matcher failed (e.g. a parser limit): end the request clearly
            events.append(self._fail(group, str(exc)))
            return
        self.stats.generated_tokens += 1
        if group.timings.first_token is None:
            group.timings.first_token = now
        events.append(SequenceStep(group.request.request_id, seq.index, out))
        if out.finish_reason is not None:
            seq.state = SeqState.FINISHED
            self.admission.retire(seq)
            if group.done:
                group.timings.finished = now
                self._groups.pop(group.request.request_id, None)
                self.stats.requests_finished += 1
                events.append(group.done_event([]))

    def _fail(self, group: RequestGroup, message: str) -> RequestFailed:
        """Drop a request after an engine failure."""
        for seq in group.sequences:
            seq.state = SeqState.CANCELLED
        self.admission.drop_group(group)
        self._groups.pop(group.request.request_id, None)
        self.stats.requests_failed += 1
        return RequestFailed(group.request.request_id, message)

    def _refresh_gauges(self) -> None:
        """Update queue depth, active count, tokens left, KV usage and prefix-cache counters."""
        self.admission.refresh_gauges(sum(group.tokens_left for group in self._groups.values()),
                                      self.kv_pool.block_bytes)
