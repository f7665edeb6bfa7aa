"""The compiled paged decode attention (float16 and float32 arenas) against the numpy reference on gathered, masked
arrays, with attention sinks, and under concurrent callers."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from worker.engine import ops


def _pooled(arena: np.ndarray, per_group: int = 4) -> np.ndarray:
    """A head-major (Hkv, NB, BS, Dh) array, which the references index, as the pool keeps it, in groups of blocks:
    (NG, Hkv, G, BS, Dh) (worker/engine/kv/arena_layout.py)."""
    n_kv, n_blocks, block_size, head_dim = arena.shape
    grouped = arena.reshape(n_kv, n_blocks // per_group, per_group, block_size, head_dim)  # (Hkv, NG, G, BS, Dh)
    return np.ascontiguousarray(grouped.swapaxes(0, 1))  # (NG, Hkv, G, BS, Dh)


def _reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, tables: np.ndarray, lengths: np.ndarray,
               first: np.ndarray) -> np.ndarray:
    """Gather every row's blocks into a padded batch and attend with an additive mask (ops.attend_decode)."""
    n_kv, _, block_size, head_dim = keys.shape
    b, nb = tables.shape
    gathered_k = np.take(keys.astype(np.float32), tables, axis=1).reshape(n_kv, b, nb * block_size, head_dim)  # (Hkv, B, L, Dh)
    gathered_v = np.take(values.astype(np.float32), tables, axis=1).reshape(n_kv, b, nb * block_size, head_dim)  # (Hkv, B, L, Dh)
    key_pos = np.arange(nb * block_size)[None, :]  # (1, L)
    hidden = (key_pos >= lengths[:, None]) | (key_pos < first[:, None])  # (B, L)
    mask = np.where(hidden, -np.inf, 0.0).astype(np.float32)  # (B, L)
    return ops.attend_decode(q, gathered_k, gathered_v, mask)  # (B, H*Dh)


@pytest.mark.parametrize("window", [0, 5, 40])
@pytest.mark.parametrize("n_heads,n_kv", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_paged_decode_matches_gathered_reference(window: int, n_heads: int, n_kv: int, head_dim: int,
                                                 dtype: type) -> None:
    """Random block tables (blocks shared between rows, as after a prefix hit) and ragged lengths agree, in the
    vector kernel (head_dim a multiple of 32) and the scalar one (16), over both pool dtypes."""
    rng = np.random.default_rng(window * 31 + n_heads + head_dim)
    block_size, n_blocks, rows = 8, 40, 6
    keys = rng.standard_normal((n_kv, n_blocks, block_size, head_dim)).astype(dtype)  # as the pool keeps them
    values = rng.standard_normal((n_kv, n_blocks, block_size, head_dim)).astype(dtype)
    lengths = rng.integers(1, 9 * block_size, rows).astype(np.int64)
    lengths[0] = 1
    width = int(-(-lengths.max() // block_size))
    tables = rng.integers(1, n_blocks, (rows, width)).astype(np.int64)
    tables[1, :2] = tables[2, :2]  # a shared prefix
    first = np.maximum(lengths - window, 0) if window else np.zeros_like(lengths)
    q = (rng.standard_normal((rows, n_heads, head_dim)) / 4).astype(np.float32)
    got = ops.paged_attend_decode(q, _pooled(keys), _pooled(values), tables, lengths, first)
    want = _reference(q, keys, values, tables, lengths, first)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim", [16, 64])
def test_attention_sinks_join_each_softmax_denominator_only(head_dim: int) -> None:
    """gpt-oss's sinks: a per-head logit in the softmax whose value row is zero (a key no query's output reads)."""
    rng = np.random.default_rng(head_dim)
    n_heads, n_kv, block_size = 8, 2, 8
    keys = rng.standard_normal((n_kv, 12, block_size, head_dim)).astype(np.float32)
    values = rng.standard_normal((n_kv, 12, block_size, head_dim)).astype(np.float32)
    lengths = np.array([1, 30, 57], np.int64)
    tables = rng.integers(1, 12, (3, 8)).astype(np.int64)
    first = np.zeros(3, np.int64)
    q = (rng.standard_normal((3, n_heads, head_dim)) / 4).astype(np.float32)
    sinks = rng.uniform(-2, 4, n_heads).astype(np.float32)  # (H,)
    got = ops.paged_attend_decode(q, _pooled(keys), _pooled(values), tables, lengths, first, sinks)
    scores = np.einsum("bhd,kbld->bhkl", q.reshape(3, n_kv, n_heads // n_kv, head_dim).reshape(3, n_heads, head_dim),
                       np.take(keys, tables, axis=1).reshape(n_kv, 3, -1, head_dim))  # (B, H, Hkv, L)
    for b in range(3):
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)
            row = np.append(scores[b, h, kv, : lengths[b]].astype(np.float64), sinks[h])  # (L+1,)
            weights = np.exp(row - row.max())
            weights /= weights.sum()
            flat_values = np.take(values, tables[b], axis=1).reshape(n_kv, -1, head_dim)[kv, : lengths[b]]  # (L, Dh)
            want = weights[:-1] @ flat_values  # (Dh,)
            np.testing.assert_allclose(got[b, h * head_dim : (h + 1) * head_dim], want, rtol=1e-5, atol=1e-5)


def test_concurrent_callers_are_serialised() -> None:
    """Two threads calling the parallel kernel at once both get the right answer (the launch lock)."""
    rng = np.random.default_rng(7)
    keys = rng.standard_normal((3, 30, 8, 16)).astype(np.float16)
    values = rng.standard_normal((3, 30, 8, 16)).astype(np.float16)
    tables = rng.integers(0, 30, (4, 5)).astype(np.int64)
    lengths = np.array([40, 3, 17, 33], np.int64)
    first = np.zeros(4, np.int64)
    q = rng.standard_normal((4, 9, 16)).astype(np.float32)
    want = _reference(q, keys, values, tables, lengths, first)
    keys, values = _pooled(keys, 3), _pooled(values, 3)
    errors: list[float] = []

    def run() -> None:
        for _ in range(50):
            errors.append(float(np.abs(ops.paged_attend_decode(q, keys, values, tables, lengths, first) - want).max()))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 150 and max(errors) < 1e-5
