"""Compiled CPU kernels (numba) for the parts of the forward pass numpy cannot do without copies.

Paged decode attention reads every sequence's keys and values in place through its block table: the numpy
path first gathers all blocks into a padded (Hkv, B, L, Dh) batch per layer, which at long contexts cost more
than the attention itself. The block matmul multiplies a few rows by a matrix kept as 8-bit codes with a scale
and offset per group (quantized.py), reading a quarter of the bytes of float32.

Parallel kernels prefer numba's OpenMP layer: on the 2-core machine the `workqueue` layer launched the block
matmul at half the speed (15-24 ms against 10 ms for SmolLM2's matrices). Where OpenMP is missing numba falls
back to workqueue. Launches go through a process-wide lock, because workqueue must not be entered by two threads
at once. OpenMP is not fork-safe: the engine runs in processes started by exec, never forked after a launch.
OpenMP's idle threads spin before they sleep; with libgomp's default spin they took the cores from OpenBLAS's
threads in the steps that use both (a 4-stream step: 278 ms against 72), so the spin is cut to 10,000 rounds,
which still bridges the gaps between one layer's kernels (1-stream step 14.0 ms, as with the default spin).
"""

from __future__ import annotations

import math
import os
import threading

import numba
import numpy as np
from numba import njit, prange

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # read when numba first loads libgomp (at the first launch)
numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]  # before the first parallel call
_launch_lock = threading.Lock()  # workqueue is not re-entrant across threads


def set_threads(count: int) -> None:
    """Threads the parallel kernels use (at most the cores numba saw at start-up)."""
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))


@njit(parallel=True, fastmath=True, cache=True)
def _paged_decode(q, keys, values, tables, lengths, first_pos, out):  # pragma: no cover (compiled)
    """One query per sequence over its positions [first_pos, length), read from blocks through its table."""
    n_seqs, n_heads, head_dim = q.shape  # q (B, H, Dh), pre-scaled
    n_kv = keys.shape[0]  # keys/values (Hkv, NB, BS, Dh)
    block_size = keys.shape[2]
    group = n_heads // n_kv
    for task in prange(n_seqs * n_kv):
        b = task // n_kv
        h = task % n_kv
        first = first_pos[b]
        length = lengths[b]
        scores = np.empty((group, length - first), np.float32)  # (G, L)
        for p in range(first, length):
            k_row = keys[h, tables[b, p // block_size], p % block_size]  # (Dh,)
            for g in range(group):
                q_row = q[b, h * group + g]  # (Dh,)
                s = np.float32(0.0)
                for d in range(head_dim):
                    s += q_row[d] * k_row[d]
                scores[g, p - first] = s
        for g in range(group):
            row = scores[g]  # (L,)
            top = row.max()
            total = np.float32(0.0)
            for i in range(length - first):
                e = np.float32(math.exp(row[i] - top))
                row[i] = e
                total += e
            inv = np.float32(1.0) / total
            o = out[b, (h * group + g) * head_dim : (h * group + g + 1) * head_dim]  # (Dh,)
            o[:] = 0.0
            for p in range(first, length):
                w = row[p - first] * inv
                v_row = values[h, tables[b, p // block_size], p % block_size]  # (Dh,)
                for d in range(head_dim):
                    o[d] += w * v_row[d]


def paged_attend_decode(q: np.ndarray, keys: np.ndarray, values: np.ndarray, tables: np.ndarray,
                        lengths: np.ndarray, first_pos: np.ndarray) -> np.ndarray:
    """Decode attention of q (B, H, Dh) over each row's positions [first_pos, lengths) in the pool: (B, H*Dh).

    keys/values are one layer's arena (Hkv, NB, BS, Dh); tables (B, nb) hold each row's block ids in order.
    """
    b, n_heads, head_dim = q.shape
    out = np.empty((b, n_heads * head_dim), np.float32)  # (B, H*Dh)
    with _launch_lock:
        _paged_decode(np.ascontiguousarray(q), keys, values, tables, lengths, first_pos, out)
    return out


def _block_matmul_kernel(group: int):  # type: ignore[no-untyped-def]
    """The compiled block matmul for one group size (a compile-time constant, so the inner loop vectorises)."""

    @njit(parallel=True, fastmath=True, cache=True)
    def block_matmul(codes, scale, offset, x, x_sums, out):  # pragma: no cover (compiled)
        """out[k, r] = sum_g scale[r, g] * (codes[r, g] . x[k, g]) + offset[r, g] * x_sums[k, g]."""
        rows, cols = codes.shape  # codes (R, C) uint8; scale/offset (R, C/G); x (K, C); x_sums (K, C/G)
        n_rows = x.shape[0]
        n_groups = cols // group
        for r in prange(rows):
            for k in range(n_rows):
                acc = np.zeros(group, np.float32)  # (G,) one lane per position in the group
                shift = np.float32(0.0)
                for g in range(n_groups):
                    base = g * group
                    s = scale[r, g]
                    for i in range(group):
                        acc[i] += np.float32(codes[r, base + i]) * (s * x[k, base + i])
                    shift += offset[r, g] * x_sums[k, g]
                out[k, r] = acc.sum() + shift

    return block_matmul


def _block_matmul_rows_kernel(group: int, n_rows: int):  # type: ignore[no-untyped-def]
    """The compiled block matmul for a fixed number of input rows (2..8): each code is converted once and used for
    every row (the 1-row kernel converts per row; at 8 rows this one takes 53 ms of SmolLM2's matrices, not 95)."""

    @njit(parallel=True, fastmath=True, cache=True)
    def block_matmul_rows(codes, scale, offset, x, x_sums, out):  # pragma: no cover (compiled)
        """out[k, r] as block_matmul's, for exactly n_rows rows of x."""
        rows, cols = codes.shape
        n_groups = cols // group
        for r in prange(rows):
            acc = np.zeros((n_rows, group), np.float32)  # (K, G)
            for g in range(n_groups):
                base = g * group
                s = scale[r, g]
                for i in range(group):
                    c = np.float32(codes[r, base + i]) * s
                    for k in range(n_rows):
                        acc[k, i] += c * x[k, base + i]
            for k in range(n_rows):
                shift = np.float32(0.0)
                for g in range(n_groups):
                    shift += offset[r, g] * x_sums[k, g]
                out[k, r] = acc[k].sum() + shift

    return block_matmul_rows


MAX_BLOCK_ROWS = 8  # rows the block matmul has a fixed-width kernel for
_block_matmul: dict[tuple[int, int], object] = {}  # (group, rows; 0 = any) -> kernel, compiled on first use


def _kernel(group: int, n_rows: int):  # type: ignore[no-untyped-def]
    """The kernel for a group size and row count: fixed-width for 2..MAX_BLOCK_ROWS, else the per-row one."""
    key = (group, n_rows if 2 <= n_rows <= MAX_BLOCK_ROWS else 0)
    if key not in _block_matmul:
        _block_matmul[key] = _block_matmul_rows_kernel(group, n_rows) if key[1] else _block_matmul_kernel(group)
    return _block_matmul[key]


def block_matmul(x: np.ndarray, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """x (K, C) times the block-coded matrix (R, C) transposed: (K, R), row-major."""
    n_rows, cols = x.shape
    group = cols // scale.shape[1]
    x = np.ascontiguousarray(x, dtype=np.float32)  # (K, C)
    x_sums = x.reshape(n_rows, -1, group).sum(axis=2)  # (K, C/G)
    out = np.empty((n_rows, codes.shape[0]), np.float32)  # (K, R)
    kernel = _kernel(group, n_rows)
    with _launch_lock:
        kernel(codes, scale, offset, x, x_sums, out)
    return out


def warm_block_matmul(groups: set[int], max_rows: int = MAX_BLOCK_ROWS) -> None:
    """Compile (or load from numba's cache) every block-matmul kernel a model will use, before its first step."""
    for group in sorted(groups):
        codes = np.zeros((2, group), np.uint8)  # (R, C)
        tables = np.zeros((2, 1), np.float32)  # (R, C/G)
        for n_rows in range(1, max_rows + 1):
            block_matmul(np.zeros((n_rows, group), np.float32), codes, tables, tables)


def warm_up() -> None:
    """Compile every kernel into numba's cache (an image build runs this so that workers start without it)."""
    keys = np.zeros((1, 2, 4, 8), np.float32)  # (Hkv, NB, BS, Dh)
    paged_attend_decode(np.zeros((1, 2, 8), np.float32), keys, keys, np.ones((1, 1), np.int64),
                        np.ones(1, np.int64), np.zeros(1, np.int64))
    warm_block_matmul({16, 32})
