"""How one worker's KV budget is split: the KV pool's blocks and, for a hybrid model, its recurrent state slots
(and their prefix checkpoints); and the slot count when it is left to the pool (auto)."""

from __future__ import annotations

from dataclasses import replace

from worker.engine.formats.config import ModelConfig
from worker.engine.kv.commit_ahead import CommitAhead
from worker.engine.kv.pool import KVPool
from worker.engine.kv.recurrent_state import RecurrentStates
from worker.engine.model import Model
from worker.schedule.scheduler_config import SchedulerConfig, auto_slots

MIB = 1 << 20


def hybrid_split(model: ModelConfig, budget_bytes: int, config: SchedulerConfig) -> tuple[int, int]:
    """(bytes left for KV blocks, recurrent state slots) of a KV budget: a hybrid model's sequences each hold a
    fixed-size state (recurrent_state.py) from the same budget, beside the prefix checkpoints (a quarter as many
    again). The slots are the configured sequence count, or as many as auto_slots gives while the states take at
    most half the budget; (budget, 0) for an attention-only model.
    ValueError when the configured sequences' states alone do not fit."""
    if not model.recurrent_layers:
        return budget_bytes, 0
    per_sequence = RecurrentStates.bytes_per_sequence(model)
    slots = config.max_sequences
    if slots <= 0:
        slots = auto_slots(budget_bytes // max(1, model.kv_bytes_per_token))
        while slots > 1 and RecurrentStates.total_bytes(model, slots) > budget_bytes // 2:
            slots -= 1
    left = budget_bytes - RecurrentStates.total_bytes(model, slots)
    if left < budget_bytes // 8:
        raise ValueError(f"{slots} sequences' recurrent state ({per_sequence / (1 << 20):.1f} MiB each) leaves too "
                         f"little of the KV budget ({budget_bytes / (1 << 20):.0f} MiB): raise LLMFLEET_KV_BUDGET_MIB "
                         "or lower LLMFLEET_SLOTS")
    return left, slots


def sized_pool(model: Model, config: SchedulerConfig) -> tuple[KVPool, SchedulerConfig]:
    """The KV pool (with a hybrid's state slots) the config's budget gives, and the config with its slot count
    settled (auto: from the pool)."""
    budget, state_slots = hybrid_split(model.config, int(config.kv_budget_mib * MIB), config)
    pool = model.new_pool(budget, enable_prefix_caching=config.prefix_cache, dtype=config.kv_dtype,
                          state_slots=state_slots)
    if config.kv_commit_ahead_mib > 0:  # a daemon thread that ends with the pool
        CommitAhead(pool, int(config.kv_commit_ahead_mib * MIB))
    if config.max_sequences <= 0:
        config = replace(config, max_sequences=state_slots or auto_slots(pool.capacity_tokens))
    return pool, config
