"""The KV commit-ahead thread (worker/engine/kv/commit_ahead.py): at start it commits its reserve of whole 2 MiB groups,
as the pool hands out higher blocks it commits as far past them, never past the pool, never changes a value, and ends
once its pool is gone."""

from __future__ import annotations

import gc
import sys
import time

import numpy as np
import pytest

from tests.support.kv_memory import one_b_shaped_pool, resident_bytes
from worker.engine.kv.arena_layout import GROUP_BYTES
from worker.engine.kv.commit_ahead import CommitAhead

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore's answer is Linux's")


def _settled(ahead: CommitAhead, groups: int) -> None:
    deadline = time.monotonic() + 10
    while ahead.committed < groups and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ahead.committed == groups


def test_the_reserve_is_committed_at_start_and_follows_the_high_water_mark(tiny_engine) -> None:
    pool = one_b_shaped_pool(tiny_engine)  # 2,048 blocks of 128 KiB (two layers): groups of 64 blocks, 8 MiB a group
    ahead = CommitAhead(pool, 12 << 20)  # 1.5 groups' worth: two whole groups
    try:
        _settled(ahead, 2)
        assert all(resident_bytes(arena) == 2 * GROUP_BYTES for arena in [*pool.keys, *pool.values])
        pool.ensure(0, 200 * 32)  # blocks 0..199: the high-water mark is in group 3 (of 0..31)
        assert pool.blocks.high_water == 200
        _settled(ahead, 6)
        assert all(resident_bytes(arena) == 6 * GROUP_BYTES for arena in [*pool.keys, *pool.values])
        assert not any(arena.any() for arena in [*pool.keys, *pool.values])  # committed, still zeros
    finally:
        ahead.stop()


def test_a_reserve_larger_than_the_pool_commits_the_pool_and_no_more(tiny_engine) -> None:
    pool = one_b_shaped_pool(tiny_engine, n_blocks=100)  # two groups, the second partly used
    rows = np.full((1, 8, 64), 3.0, np.float32)  # (N, Hkv, Dh)
    for layer in pool.config.attention_layers:
        pool.write(layer, np.array([99]), np.array([31]), rows, rows)
    ahead = CommitAhead(pool, 1 << 30)
    try:
        _settled(ahead, 2)
        time.sleep(0.3)  # a look past CHECK_S: nothing more to do
        assert ahead.committed == 2 and ahead.target() == 2
        assert all(resident_bytes(arena) == arena.nbytes for arena in [*pool.keys, *pool.values])
        assert all(float(arena.sum()) == 3.0 * 8 * 64 for arena in [*pool.keys, *pool.values])  # the one row kept
    finally:
        ahead.stop()


def test_the_thread_ends_with_its_pool(tiny_engine) -> None:
    pool = one_b_shaped_pool(tiny_engine, n_blocks=100)
    ahead = CommitAhead(pool, 1 << 20)
    _settled(ahead, 1)
    del pool
    gc.collect()
    deadline = time.monotonic() + 5
    while ahead.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not ahead.running and ahead.target() == 0
