"""The limits of one scheduler, and how the slot count is derived from the KV pool when not given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.settings import Settings

AUTO_MAX_SLOTS = 64  # past this, a step's attention and sampling grow faster than its matmuls get cheaper
AUTO_TOKENS_PER_SLOT = 320  # KV the pool should hold per slot when the slot count is derived


def auto_slots(pool_tokens: int) -> int:
    """Sequences per step derived from the KV pool (as vLLM bounds max_num_seqs by memory): 1..AUTO_MAX_SLOTS."""
    return max(1, min(AUTO_MAX_SLOTS, pool_tokens // AUTO_TOKENS_PER_SLOT))


def _default(name: str) -> Any:
    """Settings' default of one field: the deployed defaults are written once, in shared/settings.py."""
    return Settings.__dataclass_fields__[name].default


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduler; the defaults are Settings' (but the host KV tier, off unless a worker asks)."""

    max_sequences: int = _default("slots")  # sequences in one forward step; 0 = auto, from the KV pool (auto_slots)
    max_batch_tokens: int = _default("max_batch_tokens")  # tokens (decodes + prefill chunks) in one forward step
    max_prefill_tokens: int = _default("max_prefill_tokens")  # largest prefill chunk of one sequence in one step
    max_queue: int = _default("queue_limit")  # waiting requests before add() refuses
    kv_budget_mib: float = _default("kv_budget_mib")  # the KV pool, allocated once
    kv_dtype: str = _default("kv_dtype")  # its keys and values: float16 (half the bytes) or float32
    prefix_cache: bool = bool(_default("prefix_cache"))  # keep full prompt blocks in the pool's free space for reuse
    # the host's KV tier file of this model (worker/engine/kv/tier.py); 0 = none: a scheduler built without settings
    # (tests, bench/, local generation) writes no shared file; a worker's comes from LLMFLEET_KV_TIER_MIB
    kv_tier_mib: float = 0.0
    kv_tier_dir: str = _default("kv_tier_dir")  # where it lives ("" = /dev/shm/llmfleet-kv)
    kv_commit_ahead_mib: float = _default("kv_commit_ahead_mib")  # pool memory committed past its high-water mark
    speculative_tokens: int = 6  # drafts checked per greedy sequence per step (prompt lookup); 0 = off
    speculative_max_batch: int = 4  # speculate only while at most this many sequences decode (weight-bound)

    @classmethod
    def from_settings(cls, settings: Settings) -> SchedulerConfig:
        """A worker's limits, from its settings."""
        return cls(max_sequences=settings.slots, max_batch_tokens=settings.max_batch_tokens,
                   max_prefill_tokens=settings.max_prefill_tokens, kv_budget_mib=settings.kv_budget_mib,
                   kv_dtype=settings.kv_dtype, prefix_cache=bool(settings.prefix_cache),
                   max_queue=settings.queue_limit, kv_tier_mib=settings.kv_tier_mib,
                   kv_tier_dir=settings.kv_tier_dir, kv_commit_ahead_mib=settings.kv_commit_ahead_mib)
