"""Committing an arena's pages ahead of a host-tier fill: runs of blocks, contents untouched, the pool's blocks only;
an arena's groups of blocks are 2 MiB pages, so the first token written commits one page of each arena, not a page in
every head's region."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from tests.support.kv_memory import one_b_shaped_pool, resident_bytes
from worker.engine.kv.arena_layout import GROUP_BYTES, block_view, group_bytes
from worker.engine.kv.pages import populate, runs


def test_runs_group_consecutive_blocks() -> None:
    assert runs([7, 3, 4, 5, 9, 8, 3]) == [(3, 6), (7, 10)]
    assert runs([]) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populate_commits_pages_and_keeps_what_they_hold() -> None:
    array = np.zeros(8 << 20, np.uint8)  # (8 MiB,) untouched pages
    array[5_000_000] = 7
    assert populate(array, 4096, 6 << 20)  # a kernel without MADV_POPULATE_WRITE (before 5.14) answers False here
    assert array[5_000_000] == 7 and int(array.sum()) == 7
    assert not populate(array, 100, 100)  # an empty range: nothing to do


def test_a_pool_populates_its_blocks_without_changing_them(tiny_engine) -> None:
    pool = tiny_engine.model.new_pool(4 << 20, block_size=16)
    rng = np.random.default_rng(1)
    for keys in pool.keys:
        block_view(keys, 2)[...] = rng.standard_normal(block_view(keys, 2).shape)  # (Hkv, BS, Dh)
    before = [k.copy() for k in pool.keys]
    pool.populate([2, 3, 4, 9])
    assert all(np.array_equal(a, b) for a, b in zip(before, pool.keys))


def test_an_arenas_groups_of_blocks_are_aligned_2_mib_pages(tiny_engine) -> None:
    pool = one_b_shaped_pool(tiny_engine)
    for arena in [*pool.keys, *pool.values]:  # La x (NG, Hkv, G, BS, Dh)
        assert arena.shape[:3] == (32, 8, 64) and group_bytes(arena) == GROUP_BYTES
        assert arena.ctypes.data % GROUP_BYTES == 0 and arena.flags.c_contiguous
        first, last = block_view(arena, 64 * 5), block_view(arena, 64 * 5 + 63)  # group 5's first and last blocks
        assert arena.ctypes.data + 5 * GROUP_BYTES <= first.ctypes.data < last.ctypes.data < (
            arena.ctypes.data + 6 * GROUP_BYTES)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore's answer is Linux's")
def test_one_written_token_commits_its_block_not_a_page_per_head(tiny_engine) -> None:
    """A Llama-3.2-1B-shaped pool (8 KV heads of 64, 2,048 blocks: 64 MiB arenas): one token's keys and values
    commit at most one 2 MiB page of each arena (numpy asks for transparent huge pages), where head-major arenas
    committed one in each head's region (8 x 2 MiB)."""
    pool = one_b_shaped_pool(tiny_engine)
    rows = np.ones((1, 8, 64), np.float32)  # (N, Hkv, Dh)
    for layer in pool.config.attention_layers:
        pool.write(layer, np.array([5]), np.array([3]), rows, rows)
    for arena in [*pool.keys, *pool.values]:  # (NG, Hkv, G, BS, Dh), 64 MiB each
        assert resident_bytes(arena) <= (2 << 20) + mmap.PAGESIZE
