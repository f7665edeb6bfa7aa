"""Who runs: the waiting queue, admission into free slots and KV blocks, and preemption by recompute.

Waiting sequences are ordered by priority, then preempted ones ahead of new arrivals, then by arrival. A sequence
is admitted while a slot is free and the pool can hold its prompt beside one free block per running decode; a
waiting request that outranks running sequences preempts them until it fits (worker/schedule/preemption.py
chooses which). A preempted sequence gives its blocks back and waits at the front of its priority class.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import time
from collections import Counter

from worker.engine.kv.block_manager import BlockManager, NoFreeBlocks
from worker.engine.kv.recurrent_state import RecurrentStates
from worker.engine.kv.tier_link import PoolTier
from worker.engine.lora import lora_set_key
from worker.schedule.hybrid import chain_keys, restore_prefix
from worker.schedule.preemption import kv_victim, priority_victim, rank
from worker.schedule.scheduler_config import SchedulerConfig
from worker.schedule.sequences import Priority, RequestGroup, ScheduledSequence, SchedulerStats, SeqState

log = logging.getLogger(__name__)


class Admission:
    """The waiting and running sequences of one scheduler, and the rules that move them between the two."""

    def __init__(self, blocks: BlockManager | None, config: SchedulerConfig, stats: SchedulerStats,
                 tier: PoolTier | None = None, states: RecurrentStates | None = None) -> None:
        self.blocks = blocks  # None for an encoder, which keeps no KV between steps
        self.tier = tier  # the host's KV tier: read before a prompt is admitted, written as blocks fill
        self.states = states  # a hybrid's recurrent state: its prefix checkpoints are kept and restored here
        self.config = config
        self.stats = stats
        self.waiting: list[tuple[int, int, int, int, ScheduledSequence]] = []  # heap (-priority, front, order, tie, seq)
        self.active: list[ScheduledSequence] = []
        self._admissions = itertools.count()
        self._ties = itertools.count()

    @property
    def waiting_requests(self) -> int:
        """Requests waiting for their first admission (preempted ones are not counted again)."""
        return len({id(item[-1].group) for item in self.waiting if not item[-1].was_preempted})

    def below_share(self, tenant: str, priority: Priority) -> bool:
        """Whether `tenant` holds fewer running sequences of class `priority` than an equal share of the slots
        among the tenants running that class (a newcomer of a tenant at its share waits as any job)."""
        held = Counter(s.group.request.tenant for s in self.active if s.group.request.priority == priority)
        tenants = len(held) + (tenant not in held)
        return held[tenant] * tenants < self.config.max_sequences

    def push(self, seq: ScheduledSequence, *, front: bool) -> None:
        """Queue a sequence: by priority, preempted ones ahead of new arrivals, then by arrival."""
        seq.state = SeqState.PREEMPTED if front else SeqState.WAITING
        key = (-rank(seq), 0 if front else 1, seq.group.arrival, next(self._ties), seq)
        heapq.heappush(self.waiting, key)

    def peek(self) -> ScheduledSequence | None:
        """The sequence admitted next, if any waits."""
        return self.waiting[0][-1] if self.waiting else None

    def start_next(self) -> ScheduledSequence:
        """Take the first waiting sequence into the running set as a prefill."""
        seq = heapq.heappop(self.waiting)[-1]
        if seq.group.timings.admitted is None:
            seq.group.timings.admitted = time.monotonic()
        self._run(seq)
        return seq

    def _run(self, seq: ScheduledSequence) -> None:
        seq.state = SeqState.PREFILLING
        seq.admit_order = next(self._admissions)
        self.active.append(seq)

    def admit(self) -> None:
        """Move waiting sequences into free slots, best priority first, while the pool can hold their prompts."""
        assert self.blocks is not None
        floor = -1  # once a waiting sequence preempted others, none ranked below it is admitted in this pass
        while self.waiting:
            seq = self.waiting[0][-1]
            group = seq.group
            if rank(seq) < floor:
                break
            shares = seq.gen is not None and seq.index == 0 and not seq.was_preempted and group.request.n > 1
            use_cache = group.request.cache_prompt
            seed = lora_set_key(group.request.loras)  # the prefix cache is keyed by the adapter set
            computed = None
            if self._fits(seq, group.request.n if shares else 1, use_cache=use_cache, seed=seed):
                with contextlib.suppress(NoFreeBlocks):
                    computed = self.blocks.allocate(seq.seq_id, seq.target_ids, use_cache=use_cache, seed=seed)
                if computed and self.states is not None:  # a hybrid starts from a kept state, or from scratch
                    computed = restore_prefix(self.states, self.blocks, seq.seq_id, seq.target_ids, computed, seed)
                if computed is not None and self.tier is not None and use_cache and seed is None:
                    computed += self.tier.fill_partial(self.blocks.block_table(seq.seq_id), seq.target_ids, computed)
            if computed is None:
                if self.preempt_for_priority(seq):  # it outranks running sequences: make room, look again
                    floor = rank(seq)
                    continue
                break
            self.start_next()
            seq.holds_blocks, seq.computed = True, computed
            if not seq.was_preempted:
                group.cached_tokens = computed
            if shares:  # the other choices share this prefill's blocks when it is done
                for follower in group.sequences[1:]:
                    self._run(follower)

    def _fits(self, seq: ScheduledSequence, width: int, *, use_cache: bool, seed: int | None) -> bool:
        """Whether a waiting sequence (width slots) can be admitted now: a free slot, and KV for its prompt
        beside one free block per running decode (so admission does not force an immediate preemption)."""
        if len(self.active) + width > self.config.max_sequences:
            return False
        if self.tier is not None and use_cache and seed is None:  # the host tier's blocks join the pool's cache
            self.tier.fill(seq.target_ids)
        headroom = sum(1 for s in self.active if s.state == SeqState.DECODING)
        if self.active and self.blocks.num_free_blocks - headroom < self.blocks.blocks_for(len(seq.target_ids)):
            return False
        return self.blocks.can_allocate(seq.target_ids, use_cache=use_cache, seed=seed)

    def commit(self, seq: ScheduledSequence) -> None:
        """The sequence's KV up to seq.computed is in the pool: register its full blocks, offer new ones (and, once
        prefilled, its last block's rows) to the tier."""
        before = self.blocks.committed_blocks(seq.seq_id)
        self.blocks.commit(seq.seq_id, seq.target_ids[: seq.computed])
        after = self.blocks.committed_blocks(seq.seq_id)
        if self.states is not None and seq.state == SeqState.PREFILLING and seq.computed % self.blocks.block_size == 0:
            self.states.save(seq.seq_id, chain_keys(seq.target_ids, self.blocks.block_size,
                                                    lora_set_key(seq.group.request.loras), after)[-1])
        if self.tier is None or seq.group.request.loras:
            return
        if after > before:
            self.tier.offer(seq.seq_id, self.blocks.block_table(seq.seq_id), seq.target_ids, before, after)
        if seq.gen is not None and seq.computed >= len(seq.target_ids) - 1:  # prefilled: last block's rows too
            # a prompt's snapshot is kept and stops short of its last token, which the same prompt again must run
            prompt = seq.computed <= len(seq.gen.prompt_ids)
            self.tier.offer_partial(seq.seq_id, self.blocks.block_table(seq.seq_id), seq.target_ids,
                                    seq.computed - prompt, keep=prompt, running=len(self.active))

    def make_room_for_decodes(self, sitting_out: frozenset[int] = frozenset()) -> list[ScheduledSequence]:
        """Preempt until every running decode not `sitting_out` (seq ids of a held step, already extended) can append
        a token; returns the decodes left."""
        while True:
            decoding = [s for s in self.active if s.state == SeqState.DECODING and s.seq_id not in sitting_out]
            if sum(self.blocks.append_cost(s.seq_id, 1) for s in decoding) <= self.blocks.num_free_blocks:
                return decoding
            self.preempt(kv_victim(self.active))

    def preempt_for_priority(self, waiting: ScheduledSequence) -> bool:
        """Preempt the lowest-ranked running sequence that `waiting` outranks; False when there is none."""
        victim = priority_victim(self.active, waiting)
        if victim is None:
            return False
        log.info("request %s (priority %d) waits with no room: preempting request %s (priority %d)",
                 waiting.group.request.request_id, rank(waiting), victim.group.request.request_id, rank(victim))
        self.preempt(victim)
        return True

    def preempt(self, victim: ScheduledSequence) -> None:
        """Free a sequence's blocks (and those of choices waiting to share its prompt) and requeue them at the
        front of their priority class."""
        followers = [s for s in self.active if s.fork_from is victim]
        for seq in [victim, *followers]:
            self.free(seq)
            seq.pooled = None
            seq.fork_from = None
            seq.was_preempted = True
            self.active.remove(seq)
            self.push(seq, front=True)
        self.stats.preemptions += 1
        log.info("preempted request %s choice %d", victim.group.request.request_id, victim.index)

    def undo_step(self, planned: list[ScheduledSequence]) -> None:
        """A step stopped before its end and not held: each decode gives back the positions it was extended by
        (prefill chunks were allocated at admission; nothing was committed or sampled)."""
        for seq in planned:
            if seq.state == SeqState.DECODING and seq.holds_blocks:
                self.blocks.truncate(seq.seq_id, seq.computed)

    def free(self, seq: ScheduledSequence) -> None:
        """Give a sequence's blocks back to the pool (full prompt blocks stay cached until evicted)."""
        if seq.holds_blocks:
            self.blocks.free(seq.seq_id)
            seq.holds_blocks, seq.computed = False, 0
            seq.tenure += 1
            if self.tier is not None:
                self.tier.forget(seq.seq_id)

    def retire(self, seq: ScheduledSequence) -> None:
        """A running sequence ended: its blocks go back, its slot is free."""
        self.free(seq)
        self.active.remove(seq)

    def refresh_gauges(self, tokens_left: int, block_bytes: int) -> None:
        """Update queue depth, active count, tokens left, KV usage (and its peak) and prefix-cache counters."""
        assert self.blocks is not None
        stats, prefix = self.stats, self.blocks.stats
        stats.queue_depth, stats.active, stats.tokens_left = self.waiting_requests, len(self.active), tokens_left
        stats.kv_blocks_used = self.blocks.num_used_blocks
        stats.kv_bytes = self.blocks.num_used_blocks * block_bytes
        stats.kv_peak_bytes = max(stats.kv_peak_bytes, stats.kv_bytes)
        stats.prefix_queries, stats.prefix_hits, stats.prefix_tokens_hit = prefix.queries, prefix.hits, prefix.tokens_hit

    def drop_group(self, group: RequestGroup) -> None:
        """Free every sequence of a request and take them out of the running set and the queue."""
        for seq in group.sequences:
            self.free(seq)
        self.active = [s for s in self.active if s.group is not group]
        if any(item[-1].group is group for item in self.waiting):
            self.waiting = [item for item in self.waiting if item[-1].group is not group]
            heapq.heapify(self.waiting)
