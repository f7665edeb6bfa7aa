"""The wide kernels' register tiles over float32 weight rows already decoded (float_matmul.py: the block-code
and the float32 wide kernels share them): two weight rows times six, four or one rows of x, each output one fma
chain over the columns in order then vsum, the canonical reduction written in float_matmul.py's docstring."""

from __future__ import annotations

from numba import njit

from worker.engine.kernels.simd import LANES, vfma, vload, vsum, vzero


@njit(inline="always")
def _two_by_six(w, wa, x, x0, cols, out, k, r):  # pragma: no cover (compiled)
    """out[k:k+6, r:r+2] from weight rows at w[wa:], w[wa+C:] and x rows from flat offset x0 (12 chains)."""
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


@njit(inline="always")
def _two_by_four(w, wa, x, x0, cols, out, k, r):  # pragma: no cover (compiled)
    """out[k:k+4, r:r+2] from weight rows at w[wa:], w[wa+C:] and x rows from flat offset x0 (8 chains)."""
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


@njit(inline="always")
def _two_by_one(w, wa, x, x0, cols, out, k, r):  # pragma: no cover (compiled)
    """out[k, r:r+2] from weight rows at w[wa:], w[wa+C:] and the x row at flat offset x0 (two chains)."""
    wb = wa + cols
    a0 = vzero()  # (8,) weight row r
    b0 = vzero()  # (8,) weight row r+1
    for c in range(0, cols, LANES):
        t = vload(x, x0 + c)  # (8,)
        a0 = vfma(vload(w, wa + c), t, a0)
        b0 = vfma(vload(w, wb + c), t, b0)
    out[k, r], out[k, r + 1] = vsum(a0), vsum(b0)


@njit(inline="always")
def _one_row(w, wa, x, x0, cols):  # pragma: no cover (compiled)
    """The dot product of the weight row at w[wa:] and the x row at flat offset x0 (one chain)."""
    a0 = vzero()  # (8,)
    for c in range(0, cols, LANES):
        a0 = vfma(vload(w, wa + c), vload(x, x0 + c), a0)
    return vsum(a0)


@njit(inline="always")
def tile_products(w, base, count, first, flat_x, cols, n_rows, out):  # pragma: no cover (compiled)
    """out[:, first:first+count] from `count` float32 weight rows at w[base:] (row-major) and every row of x."""
    sixes = n_rows // 6
    if n_rows % 6 == 2 and sixes > 0:
        sixes -= 1  # 6k+2 rows: two fours instead of two singles
    fours = (n_rows - 6 * sixes) // 4
    pairs = count // 2
    for six in range(sixes):  # six rows of x (in L1) against every pair of the tile's weight rows
        for p in range(pairs):
            _two_by_six(w, base + 2 * p * cols, flat_x, 6 * six * cols, cols, out, 6 * six, first + 2 * p)
    for four in range(fours):
        k = 6 * sixes + 4 * four
        for p in range(pairs):
            _two_by_four(w, base + 2 * p * cols, flat_x, k * cols, cols, out, k, first + 2 * p)
    for k in range(6 * sixes + 4 * fours, n_rows):
        for p in range(pairs):
            _two_by_one(w, base + 2 * p * cols, flat_x, k * cols, cols, out, k, first + 2 * p)
    if count % 2:  # an odd last weight row
        for k in range(n_rows):
            out[k, first + count - 1] = _one_row(w, base + (count - 1) * cols, flat_x, k * cols, cols)
