"""Compiled CPU kernels (numba) for the parts of the forward pass numpy cannot do without copies.

Paged decode attention reads every sequence's keys and values in place through its block table: the numpy
path first gathers all blocks into a padded (Hkv, B, L, Dh) batch per layer, which at long contexts cost more
than the attention itself. The block matmul multiplies a few rows by a matrix kept as 8-bit codes with a scale
and offset per group (quantized.py), reading a quarter of the bytes of float32. Both hold their running sums in
eight-lane vectors (simd.py), which numba's own vectorisation of the same loops did not keep in registers.

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

from worker.engine.simd import (
    LANES,
    vadd,
    vbroadcast,
    vexp,
    vfma,
    vload,
    vload_u8,
    vmul,
    vstore,
    vsub,
    vsum,
    vzero,
)

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


@njit(parallel=True, fastmath=True, cache=True)
def _paged_decode_vectors(q, keys, values, tables, lengths, first_pos, out):  # pragma: no cover (compiled)
    """_paged_decode for head_dim % 32 == 0 and contiguous arenas, in float32x8 vectors (simd.py)."""
    n_seqs, n_heads, head_dim = q.shape  # q (B, H, Dh), pre-scaled
    n_kv, n_blocks, block_size = keys.shape[0], keys.shape[1], keys.shape[2]  # keys/values (Hkv, NB, BS, Dh)
    group = n_heads // n_kv
    flat_q = q.reshape(-1)  # (B*H*Dh,)
    flat_keys = keys.reshape(-1)  # (Hkv*NB*BS*Dh,)
    flat_values = values.reshape(-1)  # (Hkv*NB*BS*Dh,)
    flat_out = out.reshape(-1)  # (B*H*Dh,)
    for task in prange(n_seqs * n_kv):
        b = task // n_kv
        h = task % n_kv
        first = first_pos[b]
        n = lengths[b] - first
        rows = np.empty(n, np.int64)  # (L,) flat offset of each position's key/value row
        for i in range(n):
            p = first + i
            rows[i] = ((h * n_blocks + tables[b, p // block_size]) * block_size + p % block_size) * head_dim
        weights = np.empty(n, np.float32)  # (L,)
        for g in range(group):
            q_row = (b * n_heads + h * group + g) * head_dim  # also the output row's offset
            top = np.float32(-np.inf)
            for i in range(n):
                a0 = vzero()  # (8,)
                a1 = vzero()
                for d in range(0, head_dim, 2 * LANES):
                    a0 = vfma(vload(flat_q, q_row + d), vload(flat_keys, rows[i] + d), a0)  # (8,)
                    a1 = vfma(vload(flat_q, q_row + d + LANES), vload(flat_keys, rows[i] + d + LANES), a1)  # (8,)
                score = vsum(vadd(a0, a1))
                weights[i] = score
                top = max(top, score)
            sums = vzero()  # (8,)
            tops = vbroadcast(top)  # (8,)
            whole = n - n % LANES
            for i in range(0, whole, LANES):
                e = vexp(vsub(vload(weights, i), tops))  # (8,)
                vstore(weights, i, e)
                sums = vadd(sums, e)  # (8,)
            total = vsum(sums)
            for i in range(whole, n):
                e = np.float32(math.exp(weights[i] - top))
                weights[i] = e
                total += e
            inv = vbroadcast(np.float32(1.0) / total)  # (8,)
            for d in range(0, head_dim, 4 * LANES):  # 32 dims a pass: few passes over the value rows
                a0 = vzero()  # (8,) dims d:d+8
                a1 = vzero()
                a2 = vzero()
                a3 = vzero()
                for i in range(n):
                    w = vbroadcast(weights[i])  # (8,)
                    row = rows[i] + d
                    a0 = vfma(w, vload(flat_values, row), a0)  # (8,)
                    a1 = vfma(w, vload(flat_values, row + LANES), a1)  # (8,)
                    a2 = vfma(w, vload(flat_values, row + 2 * LANES), a2)  # (8,)
                    a3 = vfma(w, vload(flat_values, row + 3 * LANES), a3)  # (8,)
                vstore(flat_out, q_row + d, vmul(a0, inv))
                vstore(flat_out, q_row + d + LANES, vmul(a1, inv))
                vstore(flat_out, q_row + d + 2 * LANES, vmul(a2, inv))
                vstore(flat_out, q_row + d + 3 * LANES, vmul(a3, inv))


def paged_attend_decode(q: np.ndarray, keys: np.ndarray, values: np.ndarray, tables: np.ndarray,
                        lengths: np.ndarray, first_pos: np.ndarray) -> np.ndarray:
    """Decode attention of q (B, H, Dh) over each row's positions [first_pos, lengths) in the pool: (B, H*Dh).

    keys/values are one layer's arena (Hkv, NB, BS, Dh); tables (B, nb) hold each row's block ids in order.
    """
    b, n_heads, head_dim = q.shape
    out = np.empty((b, n_heads * head_dim), np.float32)  # (B, H*Dh)
    kernel = (_paged_decode_vectors if head_dim % (4 * LANES) == 0 and keys.flags.c_contiguous
              and values.flags.c_contiguous else _paged_decode)
    with _launch_lock:
        kernel(np.ascontiguousarray(q), keys, values, tables, lengths, first_pos, out)
    return out


ROW_TILE = 4  # output rows per task of the block matmul: their codes and a four of x stay in L1


def _block_matmul_kernel(group: int):  # type: ignore[no-untyped-def]
    """The compiled block matmul for one group size (a compile-time constant, so the group loop unrolls).

    Codes are decoded 8 at a time into a float32x8 (code * scale + offset, one FMA) and multiplied into eight
    rows of x at once, one register of sums per row (simd.py); rows left over take four, then one, at a time. A
    task takes ROW_TILE output rows, so that the rows of x in use and those rows' codes stay in L1.
    bench/block_matmul.py, SmolLM2's matrices: 1 row 10 ms, 4 rows 14-17, 8 rows 29-31, 16 rows 51-53, 32 rows
    103-107 (float32 BLAS in the same run 27-30 / 67-83 / 70-77 / 87 / 109-126); numba's own vectorisation of
    the same loops took 40-44 ms at 4 rows and 77-84 at 8.
    """
    vectors = group // LANES  # 8-lane vectors per group (4 or 2: even)

    @njit(parallel=True, fastmath=True, cache=True)
    def block_matmul(codes, scale, offset, x, out):  # pragma: no cover (compiled)
        """out[k, r] = sum_g (codes[r, g] * scale[r, g] + offset[r, g]) . x[k, g]."""
        rows, cols = codes.shape  # codes (R, C) uint8; scale/offset (R, C/G); x (K, C)
        n_rows = x.shape[0]
        n_groups = cols // group
        flat_codes = codes.reshape(-1)  # (R*C,)
        flat_x = x.reshape(-1)  # (K*C,)
        eights = n_rows // 8
        quads = n_rows // 4
        n_tiles = (rows + ROW_TILE - 1) // ROW_TILE
        for tile in prange(n_tiles):  # a few output rows per task: their codes and a four of x stay in L1
            first = tile * ROW_TILE
            last = min(rows, first + ROW_TILE)
            for e in range(eights):
                x0 = 8 * e * cols  # row 8e of x, flat
                for r in range(first, last):
                    code_row = r * cols
                    a0 = vzero()  # (8,) partial sums of row 8e (eight chains: one per row)
                    a1 = vzero()
                    a2 = vzero()
                    a3 = vzero()
                    a4 = vzero()
                    a5 = vzero()
                    a6 = vzero()
                    a7 = vzero()
                    for g in range(n_groups):
                        s = vbroadcast(scale[r, g])  # (8,)
                        m = vbroadcast(offset[r, g])  # (8,)
                        for v in range(vectors):
                            c = g * group + v * LANES
                            w = vfma(vload_u8(flat_codes, code_row + c), s, m)  # (8,) weights r, c:c+8
                            a0 = vfma(w, vload(flat_x, x0 + c), a0)  # (8,)
                            a1 = vfma(w, vload(flat_x, x0 + cols + c), a1)  # (8,)
                            a2 = vfma(w, vload(flat_x, x0 + 2 * cols + c), a2)  # (8,)
                            a3 = vfma(w, vload(flat_x, x0 + 3 * cols + c), a3)  # (8,)
                            a4 = vfma(w, vload(flat_x, x0 + 4 * cols + c), a4)  # (8,)
                            a5 = vfma(w, vload(flat_x, x0 + 5 * cols + c), a5)  # (8,)
                            a6 = vfma(w, vload(flat_x, x0 + 6 * cols + c), a6)  # (8,)
                            a7 = vfma(w, vload(flat_x, x0 + 7 * cols + c), a7)  # (8,)
                    k = 8 * e
                    out[k, r] = vsum(a0)
                    out[k + 1, r] = vsum(a1)
                    out[k + 2, r] = vsum(a2)
                    out[k + 3, r] = vsum(a3)
                    out[k + 4, r] = vsum(a4)
                    out[k + 5, r] = vsum(a5)
                    out[k + 6, r] = vsum(a6)
                    out[k + 7, r] = vsum(a7)
            for q in range(2 * eights, quads):
                x0 = 4 * q * cols  # row 4q of x, flat
                x1 = x0 + cols
                x2 = x1 + cols
                x3 = x2 + cols
                for r in range(first, last):
                    code_row = r * cols
                    a0 = vzero()  # (8,) partial sums of row 4q, even vectors of each group
                    a1 = vzero()
                    a2 = vzero()
                    a3 = vzero()
                    b0 = vzero()  # (8,) partial sums of row 4q, odd vectors (eight chains keep both FMA units busy)
                    b1 = vzero()
                    b2 = vzero()
                    b3 = vzero()
                    for g in range(n_groups):
                        s = vbroadcast(scale[r, g])  # (8,)
                        m = vbroadcast(offset[r, g])  # (8,)
                        for v in range(0, vectors, 2):
                            c = g * group + v * LANES
                            w = vfma(vload_u8(flat_codes, code_row + c), s, m)  # (8,) weights r, c:c+8
                            a0 = vfma(w, vload(flat_x, x0 + c), a0)  # (8,)
                            a1 = vfma(w, vload(flat_x, x1 + c), a1)  # (8,)
                            a2 = vfma(w, vload(flat_x, x2 + c), a2)  # (8,)
                            a3 = vfma(w, vload(flat_x, x3 + c), a3)  # (8,)
                            c += LANES
                            w = vfma(vload_u8(flat_codes, code_row + c), s, m)  # (8,) weights r, c:c+8
                            b0 = vfma(w, vload(flat_x, x0 + c), b0)  # (8,)
                            b1 = vfma(w, vload(flat_x, x1 + c), b1)  # (8,)
                            b2 = vfma(w, vload(flat_x, x2 + c), b2)  # (8,)
                            b3 = vfma(w, vload(flat_x, x3 + c), b3)  # (8,)
                    k = 4 * q
                    out[k, r] = vsum(vadd(a0, b0))
                    out[k + 1, r] = vsum(vadd(a1, b1))
                    out[k + 2, r] = vsum(vadd(a2, b2))
                    out[k + 3, r] = vsum(vadd(a3, b3))
            for r in range(first, last):
                code_row = r * cols
                for k in range(4 * quads, n_rows):
                    x0 = k * cols
                    a0 = vzero()  # (8,) two independent sums of row k
                    a1 = vzero()
                    for g in range(n_groups):
                        s = vbroadcast(scale[r, g])  # (8,)
                        m = vbroadcast(offset[r, g])  # (8,)
                        for v in range(0, vectors, 2):
                            c = g * group + v * LANES
                            a0 = vfma(vfma(vload_u8(flat_codes, code_row + c), s, m), vload(flat_x, x0 + c), a0)  # (8,)
                            c += LANES
                            a1 = vfma(vfma(vload_u8(flat_codes, code_row + c), s, m), vload(flat_x, x0 + c), a1)  # (8,)
                    out[k, r] = vsum(vadd(a0, a1))

    return block_matmul


_block_matmul: dict[int, object] = {}  # group -> kernel, compiled on first use


def block_matmul(x: np.ndarray, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """x (K, C) times the block-coded matrix (R, C) transposed: (K, R), row-major."""
    n_rows, cols = x.shape
    group = cols // scale.shape[1]
    x = np.ascontiguousarray(x, dtype=np.float32)  # (K, C)
    codes = np.ascontiguousarray(codes)  # (R, C): the kernel reads it flat (a no-op for a model's codes)
    out = np.empty((n_rows, codes.shape[0]), np.float32)  # (K, R)
    if group not in _block_matmul:
        _block_matmul[group] = _block_matmul_kernel(group)
    with _launch_lock:
        _block_matmul[group](codes, scale, offset, x, out)
    return out


def warm_block_matmul(groups: set[int]) -> None:
    """Compile (or load from numba's cache) the block-matmul kernel of every group size a model uses."""
    for group in sorted(groups):
        codes = np.zeros((2, group), np.uint8)  # (R, C)
        tables = np.zeros((2, 1), np.float32)  # (R, C/G)
        block_matmul(np.zeros((5, group), np.float32), codes, tables, tables)  # one kernel for every row count


def warm_up() -> None:
    """Compile every kernel into numba's cache (an image build runs this so that workers start without it)."""
    for head_dim in (8, 4 * LANES):  # the scalar kernel and the vector one
        keys = np.zeros((1, 2, 4, head_dim), np.float32)  # (Hkv, NB, BS, Dh)
        paged_attend_decode(np.zeros((1, 2, head_dim), np.float32), keys, keys, np.ones((1, 1), np.int64),
                            np.ones(1, np.int64), np.zeros(1, np.int64))
    warm_block_matmul({16, 32})
