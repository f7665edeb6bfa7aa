"""What a hybrid model (recurrent layers beside attention: recurrent_state.py) changes in scheduling: its prefill
chunks end on block boundaries where they can, and its state is kept there (a checkpoint) for a later prompt with
the same prefix to start from. Its state slots' share of the KV budget is pool_sizing.py's."""

from __future__ import annotations

from collections.abc import Sequence

from worker.engine.kv.block_manager import BlockManager, chain_hash
from worker.engine.kv.pool import KVPool
from worker.engine.kv.recurrent_state import RecurrentStates
from worker.schedule.sequences import ScheduledSequence


def prefill_chunk(seq: ScheduledSequence, most: int, pool: KVPool) -> int:
    """A prefilling sequence's next chunk, at most `most` tokens: a hybrid's ends on a block boundary where it can
    (aligned_chunk), unless its request keeps nothing for reuse (cache_prompt false)."""
    chunk = min(seq.pending_prefill, most)
    if pool.states is None or not seq.group.request.cache_prompt:
        return chunk
    return aligned_chunk(seq.computed, chunk, len(seq.target_ids), pool.block_size)


def aligned_chunk(computed: int, chunk: int, total: int, block_size: int) -> int:
    """A prefill chunk of at most `chunk` tokens from `computed` (of `total` to prefill) that ends on a block
    boundary where one lies inside it, and at the last boundary before the prompt's end rather than past it (the
    tail then goes in the next step): every full block of the prompt gets a checkpoint."""
    end = computed + chunk
    boundary = (end if end < total else total) // block_size * block_size
    if end == total and boundary == total:
        return chunk
    return boundary - computed if boundary > computed else chunk


def chain_keys(token_ids: Sequence[int], block_size: int, seed: int | None, blocks: int) -> list[int]:
    """The KV pool's chain keys of the first `blocks` full blocks of token_ids (key i ends block i)."""
    keys: list[int] = []
    parent = seed
    for i in range(blocks):
        parent = chain_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        keys.append(parent)
    return keys


def restore_prefix(states: RecurrentStates, blocks: BlockManager, seq_id: int, token_ids: Sequence[int],
                   cached: int, seed: int | None) -> int:
    """Where a hybrid sequence whose KV blocks are cached up to `cached` tokens starts: the deepest checkpoint
    among its cached blocks (its state restored), else 0."""
    if cached <= 0:
        return 0
    keys = chain_keys(token_ids, blocks.block_size, seed, cached // blocks.block_size)
    return states.restore(seq_id, keys, blocks.block_size, blocks.has)
