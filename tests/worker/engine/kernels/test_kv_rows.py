"""The tier's block copies (worker/engine/kernels/kv_rows.py) against numpy's, for float16 and float32 pools and any
number of rows, and the block checksum (worker/engine/kernels/block_checksum.py): any changed, moved or torn word and
the key change it."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine.kernels.block_checksum import block_digest
from worker.engine.kernels.kv_rows import byte_views, gather_rows, scatter_rows
from worker.engine.kv.arena_layout import block_view


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rows", [1, 5, 8])
def test_gather_and_scatter_rows_are_numpys_copies(dtype: type, rows: int) -> None:
    rng = np.random.default_rng(rows)
    keys = [rng.standard_normal((2, 2, 2, 8, 4)).astype(dtype) for _ in range(3)]  # L x (NG, Hkv, G, BS, Dh)
    values = [rng.standard_normal((2, 2, 2, 8, 4)).astype(dtype) for _ in range(3)]
    out = np.empty(2 * 3 * 2 * rows * 4 * np.dtype(dtype).itemsize, np.uint8)  # (2 L Hkv rows Dh x itemsize,)
    gather_rows(byte_views(keys), byte_views(values), 1, rows, out)
    expected = np.stack([np.stack([block_view(a, 1)[:, :rows] for a in keys]),
                         np.stack([block_view(a, 1)[:, :rows] for a in values])])  # block 1: group 0's second
    assert np.array_equal(out.view(dtype).reshape(expected.shape), expected)  # (2, L, Hkv, rows, Dh)
    fresh = [np.zeros_like(a) for a in keys]
    fresh_values = [np.zeros_like(a) for a in values]
    scatter_rows(out, byte_views(fresh), byte_views(fresh_values), 2, rows)
    for before, after in zip([*keys, *values], [*fresh, *fresh_values]):
        assert np.array_equal(block_view(after, 2)[:, :rows], block_view(before, 1)[:, :rows])  # group 1's first
        block_view(after, 2)[:, :rows] = 0
        assert not after.any()  # nothing else written


def test_the_block_checksum_sees_a_changed_moved_or_torn_word_and_the_key() -> None:
    data = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)  # (4096,)
    digest = block_digest(data, (1, 2))
    assert digest == block_digest(data.copy(), (1, 2)) and 0 <= digest < 2**32
    flipped = data.copy()
    flipped[1000] ^= 1
    swapped = data.view(np.uint64).copy()
    swapped[[3, 9]] = swapped[[9, 3]]
    torn = data.copy()
    torn[2048:] = 0  # a writer killed halfway
    others = {block_digest(flipped, (1, 2)), block_digest(swapped, (1, 2)), block_digest(torn, (1, 2)),
              block_digest(data, (1, 3)), block_digest(data, (2, 2))}
    assert digest not in others and len(others) == 5
    with pytest.raises(ValueError, match="64-bit words"):
        block_digest(data[:12], (1, 2))


def test_a_strided_arena_is_refused_not_copied() -> None:
    arena = np.zeros((3, 2, 1, 8, 8), np.float16)[..., :4]  # (NG, Hkv, G, BS, Dh), not contiguous
    with pytest.raises(ValueError, match="C-contiguous"):
        byte_views([arena])
