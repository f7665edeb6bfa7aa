"""Committing an arena's pages ahead of a host-tier fill: runs of blocks, contents untouched, the pool's blocks only."""

from __future__ import annotations

import sys

import numpy as np
import pytest

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
        keys[:, 2] = rng.standard_normal(keys[:, 2].shape)  # (Hkv, BS, Dh)
    before = [k.copy() for k in pool.keys]
    pool.populate([2, 3, 4, 9])
    assert all(np.array_equal(a, b) for a, b in zip(before, pool.keys))
