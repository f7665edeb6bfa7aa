"""The limits of one scheduler, and how the slot count is derived from the KV pool when not given."""

from __future__ import annotations

from dataclasses import dataclass, replace

from worker.engine.config import ModelConfig
from worker.engine.kv_pool import KVPool
from worker.engine.model import Model
from worker.engine.recurrent_state import RecurrentStates

MIB = 1 << 20

AUTO_MAX_SLOTS = 64  # past this, a step's attention and sampling grow faster than its matmuls get cheaper
AUTO_TOKENS_PER_SLOT = 320  # KV the pool should hold per slot when the slot count is derived


def auto_slots(pool_tokens: int) -> int:
    """Sequences per step derived from the KV pool (as vLLM bounds max_num_seqs by memory): 1..AUTO_MAX_SLOTS."""
    return max(1, min(AUTO_MAX_SLOTS, pool_tokens // AUTO_TOKENS_PER_SLOT))


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduler."""

    max_sequences: int = 0  # sequences in one forward step; 0 = auto, from the KV pool (see auto_slots)
    max_batch_tokens: int = 2048  # tokens (decodes + prefill chunks) in one forward step
    max_prefill_tokens: int = 512  # largest prefill chunk of one sequence in one step
    max_queue: int = 256  # waiting requests before add() refuses
    kv_budget_mib: float = 1024.0  # the KV pool, allocated once
    kv_dtype: str = "float16"  # its keys and values: float16 (half the bytes) or float32
    prefix_cache: bool = True  # keep full prompt blocks in the pool's free space for reuse
    kv_tier_mib: float = 0.0  # the host's KV tier file of this model (worker/engine/kv_tier.py); 0 = none
    kv_tier_dir: str = ""  # where it lives ("" = /dev/shm/llmfleet-kv)
    speculative_tokens: int = 6  # drafts checked per greedy sequence per step (prompt lookup); 0 = off
    speculative_max_batch: int = 4  # speculate only while at most this many sequences decode (weight-bound)


def hybrid_split(model: ModelConfig, budget_bytes: int, config: SchedulerConfig) -> tuple[int, int]:
    """(bytes left for KV blocks, recurrent state slots) of a KV budget: a hybrid model's sequences each hold a
    fixed-size state (recurrent_state.py) from the same budget. The slots are the configured sequence count, or as
    many as auto_slots gives while the states take at most half the budget; (budget, 0) for an attention-only model.
    ValueError when the configured sequences' states alone do not fit."""
    if not model.recurrent_layers:
        return budget_bytes, 0
    per_sequence = RecurrentStates.bytes_per_sequence(model)
    slots = config.max_sequences
    if slots <= 0:
        slots = auto_slots(budget_bytes // max(1, model.kv_bytes_per_token))
        slots = max(1, min(slots, budget_bytes // 2 // per_sequence))
    left = budget_bytes - slots * per_sequence
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
    if config.max_sequences <= 0:
        config = replace(config, max_sequences=state_slots or auto_slots(pool.capacity_tokens))
    return pool, config
