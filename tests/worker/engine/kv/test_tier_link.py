"""A KV pool joined to its host tier (worker/engine/kv/tier_link.py): blocks one pool wrote are read by another pool
(another worker) and the logits after a tier hit, partial or full, are the cold prefill's bit for bit
(np.array_equal); pins are given back; a tier that cannot be opened is one log line and no tier."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from worker.engine.forward_batch import BatchEntry
from worker.engine.kv.pool import KVPool
from worker.engine.kv.tier_link import PoolTier, open_tier


def _prefill(model: Any, pool: KVPool, sid: int, tokens: list[int], done: int = 0) -> np.ndarray:
    """Prefill tokens[done:] of sequence sid in chunks of 40: the last logits (V,)."""
    logits = None
    while done < len(tokens):
        piece = tokens[done : done + 40]
        pool.ensure(sid, done + len(piece))
        logits = model.forward([BatchEntry(sid, np.array(piece), done)], pool)[0]  # (V,)
        done += len(piece)
    return logits


def _written(engine: Any, directory: Path, tokens: list[int]) -> tuple[np.ndarray, PoolTier]:
    """Worker A: a cold prefill of tokens whose full blocks go to the tier; (its last logits, its link)."""
    pool = engine.model.new_pool(32 << 20, block_size=16)
    tier = open_tier(pool, engine.source, str(directory), 64)
    assert tier is not None
    pool.blocks.allocate(0, tokens)
    cold = _prefill(engine.model, pool, 0, tokens)
    pool.blocks.commit(0, tokens)
    tier.offer(0, pool.blocks.block_table(0), tokens, 0, pool.blocks.committed_blocks(0))
    assert tier.flush()
    pool.blocks.free(0)
    pool.blocks.check_invariants()  # every pin given back
    return cold, tier


def _tier_hit(engine: Any, directory: Path, tokens: list[int]) -> tuple[np.ndarray, int, PoolTier]:
    """Worker B: tokens admitted after a tier fill; (last logits, tokens that came from the tier, its link)."""
    pool = engine.model.new_pool(32 << 20, block_size=16)
    tier = open_tier(pool, engine.source, str(directory), 64)
    assert tier is not None
    added = tier.fill(tokens)
    computed = pool.blocks.allocate(0, tokens)
    assert computed == added
    logits = _prefill(engine.model, pool, 0, tokens, computed)
    pool.blocks.check_invariants()
    return logits, added, tier


def _exact_after_partial_and_full_hits(engine: Any, directory: Path, prompt: list[int]) -> None:
    cold, writer = _written(engine, directory, prompt)
    full, added, reader = _tier_hit(engine, directory, prompt)
    assert added == (len(prompt) - 1) // 16 * 16 and np.array_equal(full, cold)  # every block but the last token's
    longer = prompt + prompt[:37]
    cold_longer = _prefill(engine.model, engine.model.new_pool(32 << 20, block_size=16), 0, longer)
    partial, added, _ = _tier_hit(engine, directory, longer)
    assert 0 < added < len(longer) - 16 and np.array_equal(partial, cold_longer)
    assert reader.stats.hits == 1 and reader.stats.tokens_hit == (len(prompt) - 1) // 16 * 16
    assert writer.stats.blocks_written == len(prompt) // 16


def test_tier_hits_partial_and_full_give_the_cold_prefill_logits_tiny(tiny_engine: Any, tmp_path: Path) -> None:
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 200, 101)]
    _exact_after_partial_and_full_hits(tiny_engine, tmp_path, prompt)


@pytest.mark.slow
def test_tier_hits_partial_and_full_give_the_cold_prefill_logits_smollm2(smollm2_engine: Any, tmp_path: Path) -> None:
    text = ("The lighthouse keeper counted the ships that passed each night, writing their names in a worn leather "
            "book, and on the coldest evening of the year a vessel with no name appeared on the horizon. ") * 3
    _exact_after_partial_and_full_hits(smollm2_engine, tmp_path, smollm2_engine.encode_prompt(text))


def test_a_miss_and_a_pool_that_already_holds_the_prefix(tiny_engine: Any, tmp_path: Path) -> None:
    prompt = list(range(3, 70))
    _written(tiny_engine, tmp_path, prompt)
    _, added, tier = _tier_hit(tiny_engine, tmp_path, [5, *prompt])  # another chain from the first block
    assert added == 0 and tier.stats.misses == 1 and tier.stats.lookups == 1
    pool = tier.pool
    pool.blocks.free(0)
    assert tier.fill(prompt) == 64 and tier.fill(prompt) == 0  # the second time the pool has it: no lookup
    assert tier.stats.lookups == 2


def test_a_fill_never_takes_blocks_the_prompt_cannot_fit_beside(tiny_engine: Any, tmp_path: Path) -> None:
    prompt = list(range(3, 100))
    _written(tiny_engine, tmp_path, prompt)
    block_bytes = KVPool.bytes_per_block(tiny_engine.model.config, 16)
    pool = tiny_engine.model.new_pool(4 * block_bytes, block_size=16)  # 4 blocks: the prompt needs 7
    tier = open_tier(pool, tiny_engine.source, str(tmp_path), 16)
    assert tier is not None and tier.fill(prompt) == 0 and pool.blocks.num_free_blocks == 4


def test_an_unusable_directory_is_one_line_and_no_tier(tiny_engine: Any, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    caplog.set_level(logging.INFO)
    pool = tiny_engine.model.new_pool(1 << 20, block_size=16)
    assert open_tier(pool, tiny_engine.source, str(blocker / "kv"), 16) is None
    assert open_tier(pool, tiny_engine.source, str(tmp_path), 0) is None  # 0: off, silently
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "LLMFLEET_KV_TIER_DIR" in warnings[0]


def test_a_partial_block_snapshot_resumes_a_sequence_exactly_and_replaces_the_last(tiny_engine: Any,
                                                                                     tmp_path: Path) -> None:
    tokens = [int(t) for t in np.random.default_rng(2).integers(3, 200, 16 * 3 + 11)]
    cold = _prefill(tiny_engine.model, tiny_engine.model.new_pool(32 << 20, block_size=16), 0, tokens)
    pool = tiny_engine.model.new_pool(32 << 20, block_size=16)  # worker A: 3 full blocks, then 4, 8 rows of the 4th
    writer = open_tier(pool, tiny_engine.source, str(tmp_path), 64)
    assert writer is not None
    pool.blocks.allocate(0, tokens)
    _prefill(tiny_engine.model, pool, 0, tokens)
    pool.blocks.commit(0, tokens)
    writer.offer(0, pool.blocks.block_table(0), tokens, 0, 3)
    for computed in (16 * 3 + 2, 16 * 3 + 4, 16 * 3 + 9):  # snapshots of 2, 4 and 9 rows, each in the last's slot
        writer.offer_partial(0, pool.blocks.block_table(0), tokens, computed)
    assert writer.flush() and writer.stats.blocks_written == 3 + 3
    assert writer.tier.bytes_used() == 4 * writer.tier.slot_bytes
    pool.blocks.free(0)
    pool.blocks.check_invariants()

    reader = tiny_engine.model.new_pool(32 << 20, block_size=16)  # worker B takes the sequence over
    tier = open_tier(reader, tiny_engine.source, str(tmp_path), 64)
    assert tier is not None and tier.fill(tokens) == 48
    computed = reader.blocks.allocate(0, tokens)
    added = tier.fill_partial(reader.blocks.block_table(0), tokens, computed)
    assert (computed, added) == (48, 9)
    assert np.array_equal(_prefill(tiny_engine.model, reader, 0, tokens, computed + added), cold)
    other = tokens[:50] + [7] * 9  # the same 2 rows into the block, then others: the 2-row snapshot is gone
    assert tier.fill_partial(reader.blocks.block_table(0), other, 48) == 0

    longer = tokens[:48] + [5] * 16  # another sequence on A, in a step of 32: a snapshot every 3 rows
    pool.blocks.allocate(1, longer)
    for computed in range(48 + 1, 48 + 9):
        writer.offer_partial(1, pool.blocks.block_table(1), longer, computed, running=32)
    assert writer.flush() and writer.stats.blocks_written == 6 + 3  # at 1, 4 and 7 rows
    assert writer.flush() and writer.tier.bytes_used() == 5 * writer.tier.slot_bytes
    writer.offer(1, pool.blocks.block_table(1), longer, 3, 4)
    assert writer.flush() and writer.tier.bytes_used() == 5 * writer.tier.slot_bytes  # the block for its snapshot
    pool.blocks.free(1)
    pool.blocks.check_invariants()
