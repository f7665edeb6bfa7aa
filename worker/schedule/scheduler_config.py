"""The limits of one scheduler, and how the slot count is derived from the KV pool when not given."""

from __future__ import annotations

from dataclasses import dataclass

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
    kv_tier_mib: float = 0.0  # the host's KV tier file of this model (worker/engine/kv/tier.py); 0 = none
    kv_tier_dir: str = ""  # where it lives ("" = /dev/shm/llmfleet-kv)
    speculative_tokens: int = 6  # drafts checked per greedy sequence per step (prompt lookup); 0 = off
    speculative_max_batch: int = 4  # speculate only while at most this many sequences decode (weight-bound)
