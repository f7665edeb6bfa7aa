"""Matmuls over block codes: x (K, C) times a matrix kept as 8-bit codes with a scale and offset per group of
columns (quantized.py), reading a quarter of the bytes of float32. Two compiled kernels, by the step's width:

- narrow (K < WIDE_ROWS, decode steps of a few streams): each weight is decoded in registers (code * scale +
  offset, one FMA) and multiplied into eight rows of x at once; memory traffic is the codes, and decoding a
  weight costs less than reading it as float32 would;
- wide (K >= WIDE_ROWS): a task decodes DECODED_TILE weight rows once into float32 scratch (in L1 for 576 columns,
  in L2 for 1536), then runs a two-by-six register tile over x (two weight rows times six rows of x, twelve sums in
  twelve AVX registers; rows left over go four, then one, at a time): per eight columns 2 weight loads and 6 x loads
  feed 12 FMAs, where the narrow kernel's 9 loads and a decode fed 8. SmolLM2's matrices, ms, narrow against wide in
  one process, alternating: 16 rows 48 / 40, 24 rows 62 / 50, 32 rows 104 / 77 (12 rows 28 / 30: below 16 the narrow
  kernel's eights and fours win); the wide kernel against float32 BLAS (bench/block_matmul.py): 32 rows 64-72 /
  83-88, 64 rows 126-132 / 127-152.

Both hold their sums in eight-lane vectors (simd.py). Launches hold numba_runtime.launch_lock (see kernels.py for
the threading layer).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from worker.engine.numba_runtime import launch_lock
from worker.engine.simd import LANES, vadd, vbroadcast, vfma, vload, vload_u8, vstore, vsum, vzero

WIDE_ROWS = 16  # rows of x from which the wide kernel is used
DECODED_TILE = 8  # weight rows a wide task decodes at once (8 x 1536 float32 = 48 KiB at most for SmolLM2: L2)


ROW_TILE = 4  # output rows per task of the narrow kernel: their codes and a four of x stay in L1


def _narrow_kernel(group: int):  # type: ignore[no-untyped-def]
    """The narrow block matmul for one group size (a compile-time constant, so the group loop unrolls).

    Codes are decoded 8 at a time into a float32x8 (code * scale + offset, one FMA) and multiplied into eight
    rows of x at once, one register of sums per row (simd.py); rows left over take four, then one, at a time. A
    task takes ROW_TILE output rows, so that the rows of x in use and those rows' codes stay in L1.
    bench/block_matmul.py, SmolLM2's matrices: 1 row 10 ms, 4 rows 14-17, 8 rows 29-31 (float32 BLAS in the
    same run 27-30 / 67-83 / 70-77); numba's own vectorisation of the same loops took 40-44 ms at 4 rows and
    77-84 at 8.
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


@njit(fastmath=True, cache=True, inline="always")
def _two_by_six(w, wa, x, x0, cols, out, k, r):  # pragma: no cover (compiled)
    """out[k:k+6, r:r+2] from weight rows at w[wa:], w[wa+C:] and x rows from flat offset x0 (12 sums)."""
    wb = wa + cols
    a0 = vzero()  # (8,) weight row r times x row k
    a1 = vzero()
    a2 = vzero()
    a3 = vzero()
    a4 = vzero()
    a5 = vzero()
    b0 = vzero()  # (8,) weight row r+1 times x row k
    b1 = vzero()
    b2 = vzero()
    b3 = vzero()
    b4 = vzero()
    b5 = vzero()
    for c in range(0, cols, LANES):
        w0 = vload(w, wa + c)  # (8,)
        w1 = vload(w, wb + c)  # (8,)
        t = vload(x, x0 + c)  # (8,)
        a0 = vfma(w0, t, a0)
        b0 = vfma(w1, t, b0)
        t = vload(x, x0 + cols + c)  # (8,)
        a1 = vfma(w0, t, a1)
        b1 = vfma(w1, t, b1)
        t = vload(x, x0 + 2 * cols + c)  # (8,)
        a2 = vfma(w0, t, a2)
        b2 = vfma(w1, t, b2)
        t = vload(x, x0 + 3 * cols + c)  # (8,)
        a3 = vfma(w0, t, a3)
        b3 = vfma(w1, t, b3)
        t = vload(x, x0 + 4 * cols + c)  # (8,)
        a4 = vfma(w0, t, a4)
        b4 = vfma(w1, t, b4)
        t = vload(x, x0 + 5 * cols + c)  # (8,)
        a5 = vfma(w0, t, a5)
        b5 = vfma(w1, t, b5)
    out[k, r], out[k, r + 1] = vsum(a0), vsum(b0)
    out[k + 1, r], out[k + 1, r + 1] = vsum(a1), vsum(b1)
    out[k + 2, r], out[k + 2, r + 1] = vsum(a2), vsum(b2)
    out[k + 3, r], out[k + 3, r + 1] = vsum(a3), vsum(b3)
    out[k + 4, r], out[k + 4, r + 1] = vsum(a4), vsum(b4)
    out[k + 5, r], out[k + 5, r + 1] = vsum(a5), vsum(b5)


@njit(fastmath=True, cache=True, inline="always")
def _two_by_four(w, wa, x, x0, cols, out, k, r):  # pragma: no cover (compiled)
    """out[k:k+4, r:r+2] from weight rows at w[wa:], w[wa+C:] and x rows from flat offset x0 (8 sums)."""
    wb = wa + cols
    a0 = vzero()  # (8,) weight row r times x row k
    a1 = vzero()
    a2 = vzero()
    a3 = vzero()
    b0 = vzero()  # (8,) weight row r+1 times x row k
    b1 = vzero()
    b2 = vzero()
    b3 = vzero()
    for c in range(0, cols, LANES):
        w0 = vload(w, wa + c)  # (8,)
        w1 = vload(w, wb + c)  # (8,)
        t = vload(x, x0 + c)  # (8,)
        a0 = vfma(w0, t, a0)
        b0 = vfma(w1, t, b0)
        t = vload(x, x0 + cols + c)  # (8,)
        a1 = vfma(w0, t, a1)
        b1 = vfma(w1, t, b1)
        t = vload(x, x0 + 2 * cols + c)  # (8,)
        a2 = vfma(w0, t, a2)
        b2 = vfma(w1, t, b2)
        t = vload(x, x0 + 3 * cols + c)  # (8,)
        a3 = vfma(w0, t, a3)
        b3 = vfma(w1, t, b3)
    out[k, r], out[k, r + 1] = vsum(a0), vsum(b0)
    out[k + 1, r], out[k + 1, r + 1] = vsum(a1), vsum(b1)
    out[k + 2, r], out[k + 2, r + 1] = vsum(a2), vsum(b2)
    out[k + 3, r], out[k + 3, r + 1] = vsum(a3), vsum(b3)


@njit(fastmath=True, cache=True, inline="always")
def _two_by_one(w, wa, x, x0, cols, out, k, r):  # pragma: no cover (compiled)
    """out[k, r:r+2] from weight rows at w[wa:], w[wa+C:] and the x row at flat offset x0 (two chains each)."""
    wb = wa + cols
    a0 = vzero()  # (8,) weight row r, even vectors
    a1 = vzero()  # (8,) odd vectors
    b0 = vzero()  # (8,) weight row r+1
    b1 = vzero()
    for c in range(0, cols, 2 * LANES):
        t = vload(x, x0 + c)  # (8,)
        a0 = vfma(vload(w, wa + c), t, a0)
        b0 = vfma(vload(w, wb + c), t, b0)
        t = vload(x, x0 + c + LANES)  # (8,)
        a1 = vfma(vload(w, wa + c + LANES), t, a1)
        b1 = vfma(vload(w, wb + c + LANES), t, b1)
    out[k, r], out[k, r + 1] = vsum(vadd(a0, a1)), vsum(vadd(b0, b1))


@njit(fastmath=True, cache=True, inline="always")
def _one_row(w, wa, x, x0, cols):  # pragma: no cover (compiled)
    """The dot product of the weight row at w[wa:] and the x row at flat offset x0."""
    a0 = vzero()  # (8,)
    a1 = vzero()
    for c in range(0, cols, 2 * LANES):
        a0 = vfma(vload(w, wa + c), vload(x, x0 + c), a0)
        a1 = vfma(vload(w, wa + c + LANES), vload(x, x0 + c + LANES), a1)
    return vsum(vadd(a0, a1))


@njit(parallel=True, fastmath=True, cache=True)
def _wide(codes, scale, offset, x, out):  # pragma: no cover (compiled)
    """out[k, r] = sum_g (codes[r, g] * scale[r, g] + offset[r, g]) . x[k, g], a tile of weight rows per task."""
    rows, cols = codes.shape  # codes (R, C) uint8; scale/offset (R, C/G); x (K, C)
    n_rows = x.shape[0]
    group = cols // scale.shape[1]
    flat_codes = codes.reshape(-1)  # (R*C,)
    flat_x = x.reshape(-1)  # (K*C,)
    sixes = n_rows // 6
    if n_rows % 6 == 2 and sixes > 0:
        sixes -= 1  # 6k+2 rows: two fours instead of two singles
    fours = (n_rows - 6 * sixes) // 4
    n_tiles = (rows + DECODED_TILE - 1) // DECODED_TILE
    for tile in prange(n_tiles):
        first = tile * DECODED_TILE
        count = min(rows, first + DECODED_TILE) - first
        w = np.empty(count * cols, np.float32)  # (T*C,) this tile's weight rows, decoded
        for j in range(count):
            r = first + j
            for g in range(cols // group):
                s = vbroadcast(scale[r, g])  # (8,)
                m = vbroadcast(offset[r, g])  # (8,)
                for v in range(0, group, LANES):
                    c = g * group + v
                    vstore(w, j * cols + c, vfma(vload_u8(flat_codes, r * cols + c), s, m))  # (8,) weights r, c:c+8
        pairs = count // 2
        for six in range(sixes):  # six rows of x (in L1) against every pair of the tile's weight rows
            for p in range(pairs):
                _two_by_six(w, 2 * p * cols, flat_x, 6 * six * cols, cols, out, 6 * six, first + 2 * p)
        for four in range(fours):
            k = 6 * sixes + 4 * four
            for p in range(pairs):
                _two_by_four(w, 2 * p * cols, flat_x, k * cols, cols, out, k, first + 2 * p)
        for k in range(6 * sixes + 4 * fours, n_rows):
            for p in range(pairs):
                _two_by_one(w, 2 * p * cols, flat_x, k * cols, cols, out, k, first + 2 * p)
        if count % 2:  # an odd last weight row
            for k in range(n_rows):
                out[k, first + count - 1] = _one_row(w, (count - 1) * cols, flat_x, k * cols, cols)


_narrow: dict[int, object] = {}  # group -> narrow kernel, compiled on first use


def block_matmul(x: np.ndarray, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """x (K, C) times the block-coded matrix (R, C) transposed: (K, R), row-major."""
    n_rows, cols = x.shape
    group = cols // scale.shape[1]
    x = np.ascontiguousarray(x, dtype=np.float32)  # (K, C)
    codes = np.ascontiguousarray(codes)  # (R, C): the kernels read it flat (a no-op for a model's codes)
    out = np.empty((n_rows, codes.shape[0]), np.float32)  # (K, R)
    if n_rows >= WIDE_ROWS:
        kernel = _wide
    else:
        if group not in _narrow:
            _narrow[group] = _narrow_kernel(group)
        kernel = _narrow[group]
    with launch_lock:
        kernel(codes, scale, offset, x, out)
    return out


def warm(groups: set[int]) -> None:
    """Compile (or load from numba's cache) the narrow kernel of every group size a model uses, and the wide one,
    for writeable arrays and for read-only ones (codes mapped from the repack cache: another numba type)."""
    for group in sorted(groups):
        for writeable in (True, False):
            codes = np.zeros((2, group), np.uint8)  # (R, C)
            tables = np.zeros((2, 1), np.float32)  # (R, C/G)
            codes.flags.writeable = tables.flags.writeable = writeable
            block_matmul(np.zeros((5, group), np.float32), codes, tables, tables)  # one narrow kernel, 1..15 rows
            block_matmul(np.zeros((WIDE_ROWS, group), np.float32), codes, tables, tables)
