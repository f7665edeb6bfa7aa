"""Matmuls over packed 4-bit codes (quant_blocks.pack_nibbles: two codes a byte, a float32 scale and offset per
group of 32 columns): x (K, C) times the matrix (R, C) transposed, reading 0.75 bytes a weight where 8-bit codes
(block_kernels.py) read 1.25. One 8-byte load gives two float32x8 of weights: its low nibbles are columns j..j+7
of a block, its high nibbles columns j+16..j+23.

Canonical reduction (batch invariance): every kernel and tile computes out[k, r] = vsum(acc), acc one float32x8
chain over the columns in order 0..C step 8, acc = fma(w[r, c:c+8], x[k, c:c+8], acc), w = fma(code, scale,
offset) in float32, with simd.py's vfma and vsum (LLVM may not reorder them). A row's result is therefore the
same bits whatever else is in its step and wherever it sits; `reference_matmul` is the same arithmetic in numpy.
Parallelism between FMAs comes from tiling several weight rows and x rows, never from splitting a chain.

- narrow (K < WIDE_ROWS): a task takes a pair of weight rows, decodes a block of each in registers (one 8-byte
  load, two nibble vectors) and runs it against fours of x rows (eight chains), then a pair (four), then a single
  (two); one weight row runs one chain only when the matrix has an odd last row.
- wide (K >= WIDE_ROWS): a task decodes DECODED_TILE weight rows into float32 scratch (the same decode, so the
  same weights), then runs two-by-six register tiles over x (twelve chains), then fours, then singles, one span
  of COLUMN_SPAN columns at a time: a chain waits in scratch between spans (stored and reloaded exactly, so its
  order is unchanged) and the span of x it reads stays in L1.

Launches hold numba_runtime.launch_lock.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from worker.engine.numba_runtime import launch_lock
from worker.engine.quant_blocks import NIBBLE_BLOCK, unpack_nibbles
from worker.engine.simd import (
    LANES,
    vbroadcast,
    vfma,
    vload,
    vload_high_nibbles,
    vload_low_nibbles,
    vstore,
    vsum,
    vzero,
)

WIDE_ROWS = 16  # rows of x from which the wide kernel is used
DECODED_TILE = 8  # weight rows a wide task decodes at once (8 x 8192 float32 = 256 KiB at most for a 1B's down)
COLUMN_SPAN = 512  # columns a wide task's register tiles cover before moving on (x's span of six rows: 12 KiB)
_BLOCK_BYTES = NIBBLE_BLOCK // 2  # packed bytes of one block of 32 columns


def reference_matmul(x: np.ndarray, packed: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The kernels' arithmetic in numpy, step by step: x (K, C) times the packed matrix (R, C) transposed: (K, R).
    An FMA is a float64 product (exact for float32 factors) plus the addend, rounded to float32."""
    codes = unpack_nibbles(packed).astype(np.float64)  # (R, C)
    rows, cols = codes.shape
    group = cols // scale.shape[1]
    s = np.repeat(scale.astype(np.float64), group, axis=1)  # (R, C)
    m = np.repeat(offset.astype(np.float64), group, axis=1)  # (R, C)
    w = (codes * s + m).astype(np.float32).astype(np.float64)  # (R, C) decoded weights
    xs = np.asarray(x, np.float32).astype(np.float64)  # (K, C)
    acc = np.zeros((xs.shape[0], rows, LANES), np.float32)  # (K, R, 8) one chain per output
    for c in range(0, cols, LANES):
        product = xs[:, None, c : c + LANES] * w[None, :, c : c + LANES]  # (K, R, 8) exact
        acc = (product + acc).astype(np.float32)  # (K, R, 8)
    half = acc[:, :, :4] + acc[:, :, 4:]  # (K, R, 4)
    quarter = half[:, :, :2] + half[:, :, 2:]  # (K, R, 2)
    return quarter[:, :, 0] + quarter[:, :, 1]  # (K, R)


@njit(cache=True, inline="always")
def _block_weights(flat, at, s, m):  # pragma: no cover (compiled)
    """The 32 weights of the block whose packed bytes start at flat[at]: four (8,) vectors in column order (one
    8-byte load gives columns 0-7 and 16-23, the next 8-15 and 24-31)."""
    return (vfma(vload_low_nibbles(flat, at), s, m), vfma(vload_low_nibbles(flat, at + LANES), s, m),
            vfma(vload_high_nibbles(flat, at), s, m), vfma(vload_high_nibbles(flat, at + LANES), s, m))


@njit(cache=True, inline="always")
def _chain(w, x, xa, a):  # pragma: no cover (compiled)
    """The chain a carried over one block: a block's weights w (four (8,)) times x[xa:xa+32], in column order."""
    a = vfma(w[0], vload(x, xa), a)
    a = vfma(w[1], vload(x, xa + LANES), a)
    a = vfma(w[2], vload(x, xa + 2 * LANES), a)
    return vfma(w[3], vload(x, xa + 3 * LANES), a)


@njit(cache=True, inline="always")
def _coded_two_by_four(flat, scale, offset, r, half, x, k, cols, out):  # pragma: no cover (compiled)
    """out[k:k+4, r:r+2]: weight rows r, r+1 decoded in registers against x rows k..k+3 (eight chains)."""
    a0 = vzero()  # (8,) weight row r times x row k
    a1 = vzero()
    a2 = vzero()
    a3 = vzero()
    b0 = vzero()  # (8,) weight row r+1 times x row k
    b1 = vzero()
    b2 = vzero()
    b3 = vzero()
    for block in range(cols // NIBBLE_BLOCK):
        at = r * half + block * _BLOCK_BYTES
        xa = k * cols + block * NIBBLE_BLOCK
        w = _block_weights(flat, at, vbroadcast(scale[r, block]), vbroadcast(offset[r, block]))  # 4 x (8,)
        a0 = _chain(w, x, xa, a0)
        a1 = _chain(w, x, xa + cols, a1)
        a2 = _chain(w, x, xa + 2 * cols, a2)
        a3 = _chain(w, x, xa + 3 * cols, a3)
        w = _block_weights(flat, at + half, vbroadcast(scale[r + 1, block]), vbroadcast(offset[r + 1, block]))
        b0 = _chain(w, x, xa, b0)
        b1 = _chain(w, x, xa + cols, b1)
        b2 = _chain(w, x, xa + 2 * cols, b2)
        b3 = _chain(w, x, xa + 3 * cols, b3)
    out[k, r], out[k, r + 1] = vsum(a0), vsum(b0)
    out[k + 1, r], out[k + 1, r + 1] = vsum(a1), vsum(b1)
    out[k + 2, r], out[k + 2, r + 1] = vsum(a2), vsum(b2)
    out[k + 3, r], out[k + 3, r + 1] = vsum(a3), vsum(b3)


@njit(cache=True, inline="always")
def _coded_two_by_two(flat, scale, offset, r, half, x, k, cols, out):  # pragma: no cover (compiled)
    """out[k:k+2, r:r+2]: weight rows r, r+1 decoded in registers against x rows k, k+1 (four chains)."""
    a0 = vzero()  # (8,) weight row r times x row k
    a1 = vzero()
    b0 = vzero()  # (8,) weight row r+1 times x row k
    b1 = vzero()
    for block in range(cols // NIBBLE_BLOCK):
        at = r * half + block * _BLOCK_BYTES
        xa = k * cols + block * NIBBLE_BLOCK
        w = _block_weights(flat, at, vbroadcast(scale[r, block]), vbroadcast(offset[r, block]))  # 4 x (8,)
        a0 = _chain(w, x, xa, a0)
        a1 = _chain(w, x, xa + cols, a1)
        w = _block_weights(flat, at + half, vbroadcast(scale[r + 1, block]), vbroadcast(offset[r + 1, block]))
        b0 = _chain(w, x, xa, b0)
        b1 = _chain(w, x, xa + cols, b1)
    out[k, r], out[k, r + 1] = vsum(a0), vsum(b0)
    out[k + 1, r], out[k + 1, r + 1] = vsum(a1), vsum(b1)


@njit(cache=True, inline="always")
def _coded_two_by_one(flat, scale, offset, r, half, x, k, cols, out):  # pragma: no cover (compiled)
    """out[k, r:r+2]: weight rows r, r+1 decoded in registers against x row k (two chains)."""
    a0 = vzero()  # (8,) weight row r
    b0 = vzero()  # (8,) weight row r+1
    for block in range(cols // NIBBLE_BLOCK):
        at = r * half + block * _BLOCK_BYTES
        xa = k * cols + block * NIBBLE_BLOCK
        a0 = _chain(_block_weights(flat, at, vbroadcast(scale[r, block]), vbroadcast(offset[r, block])), x, xa, a0)
        b0 = _chain(_block_weights(flat, at + half, vbroadcast(scale[r + 1, block]), vbroadcast(offset[r + 1, block])),
                    x, xa, b0)
    out[k, r], out[k, r + 1] = vsum(a0), vsum(b0)


@njit(cache=True, inline="always")
def _coded_one_by_one(flat, scale, offset, r, half, x, k, cols):  # pragma: no cover (compiled)
    """out[k, r]: one weight row decoded in registers against one x row (one chain: an odd last weight row)."""
    a0 = vzero()  # (8,)
    for block in range(cols // NIBBLE_BLOCK):
        w = _block_weights(flat, r * half + block * _BLOCK_BYTES, vbroadcast(scale[r, block]),
                           vbroadcast(offset[r, block]))  # 4 x (8,)
        a0 = _chain(w, x, k * cols + block * NIBBLE_BLOCK, a0)
    return vsum(a0)


@njit(parallel=True, nogil=True, cache=True)
def _narrow(packed, scale, offset, x, out):  # pragma: no cover (compiled)
    """out[k, r] = w[r] . x[k] for a few rows of x, codes decoded in registers, a pair of weight rows per task."""
    rows, half = packed.shape  # packed (R, C/2) uint8; scale/offset (R, C/32); x (K, C)
    cols = 2 * half
    n_rows = x.shape[0]
    flat = packed.reshape(-1)  # (R*C/2,)
    flat_x = x.reshape(-1)  # (K*C,)
    fours = n_rows // 4
    pairs = (n_rows - 4 * fours) // 2
    for pair in prange(rows // 2):
        r = 2 * pair
        for four in range(fours):
            _coded_two_by_four(flat, scale, offset, r, half, flat_x, 4 * four, cols, out)
        for p in range(pairs):
            _coded_two_by_two(flat, scale, offset, r, half, flat_x, 4 * fours + 2 * p, cols, out)
        if n_rows % 2:
            _coded_two_by_one(flat, scale, offset, r, half, flat_x, n_rows - 1, cols, out)
    if rows % 2:  # an odd last weight row
        for k in range(n_rows):
            out[k, rows - 1] = _coded_one_by_one(flat, scale, offset, rows - 1, half, flat_x, k, cols)


@njit(cache=True, inline="always")
def _decode_row(flat, scale, offset, r, half, w, wa):  # pragma: no cover (compiled)
    """Weight row r decoded into float32 scratch w[wa:wa+C]."""
    for block in range(2 * half // NIBBLE_BLOCK):
        ws = _block_weights(flat, r * half + block * _BLOCK_BYTES, vbroadcast(scale[r, block]),
                            vbroadcast(offset[r, block]))  # 4 x (8,)
        c = wa + block * NIBBLE_BLOCK
        vstore(w, c, ws[0])
        vstore(w, c + LANES, ws[1])
        vstore(w, c + 2 * LANES, ws[2])
        vstore(w, c + 3 * LANES, ws[3])


@njit(cache=True, inline="always")
def _two_by_six(w, wa, x, x0, cols, c0, c1, acc, ia, stride):  # pragma: no cover (compiled)
    """Twelve chains carried over columns c0..c1: decoded weight rows w[wa:], w[wa+C:] against six x rows from flat
    offset x0; x row i's two chains live at acc[ia + i*stride] and the next eight floats."""
    wb = wa + cols
    a0 = vload(acc, ia)  # (8,) weight row r times x row k
    a1 = vload(acc, ia + stride)
    a2 = vload(acc, ia + 2 * stride)
    a3 = vload(acc, ia + 3 * stride)
    a4 = vload(acc, ia + 4 * stride)
    a5 = vload(acc, ia + 5 * stride)
    b0 = vload(acc, ia + LANES)  # (8,) weight row r+1 times x row k
    b1 = vload(acc, ia + stride + LANES)
    b2 = vload(acc, ia + 2 * stride + LANES)
    b3 = vload(acc, ia + 3 * stride + LANES)
    b4 = vload(acc, ia + 4 * stride + LANES)
    b5 = vload(acc, ia + 5 * stride + LANES)
    for c in range(c0, c1, LANES):
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
    vstore(acc, ia, a0)
    vstore(acc, ia + stride, a1)
    vstore(acc, ia + 2 * stride, a2)
    vstore(acc, ia + 3 * stride, a3)
    vstore(acc, ia + 4 * stride, a4)
    vstore(acc, ia + 5 * stride, a5)
    vstore(acc, ia + LANES, b0)
    vstore(acc, ia + stride + LANES, b1)
    vstore(acc, ia + 2 * stride + LANES, b2)
    vstore(acc, ia + 3 * stride + LANES, b3)
    vstore(acc, ia + 4 * stride + LANES, b4)
    vstore(acc, ia + 5 * stride + LANES, b5)


@njit(cache=True, inline="always")
def _two_by_four(w, wa, x, x0, cols, c0, c1, acc, ia, stride):  # pragma: no cover (compiled)
    """Eight chains carried over columns c0..c1: _two_by_six for four x rows."""
    wb = wa + cols
    a0 = vload(acc, ia)  # (8,) weight row r times x row k
    a1 = vload(acc, ia + stride)
    a2 = vload(acc, ia + 2 * stride)
    a3 = vload(acc, ia + 3 * stride)
    b0 = vload(acc, ia + LANES)  # (8,) weight row r+1 times x row k
    b1 = vload(acc, ia + stride + LANES)
    b2 = vload(acc, ia + 2 * stride + LANES)
    b3 = vload(acc, ia + 3 * stride + LANES)
    for c in range(c0, c1, LANES):
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
    vstore(acc, ia, a0)
    vstore(acc, ia + stride, a1)
    vstore(acc, ia + 2 * stride, a2)
    vstore(acc, ia + 3 * stride, a3)
    vstore(acc, ia + LANES, b0)
    vstore(acc, ia + stride + LANES, b1)
    vstore(acc, ia + 2 * stride + LANES, b2)
    vstore(acc, ia + 3 * stride + LANES, b3)


@njit(cache=True, inline="always")
def _two_by_one(w, wa, x, x0, cols, c0, c1, acc, ia):  # pragma: no cover (compiled)
    """Two chains carried over columns c0..c1: decoded weight rows w[wa:], w[wa+C:] against one x row."""
    wb = wa + cols
    a0 = vload(acc, ia)  # (8,) weight row r
    b0 = vload(acc, ia + LANES)  # (8,) weight row r+1
    for c in range(c0, c1, LANES):
        t = vload(x, x0 + c)  # (8,)
        a0 = vfma(vload(w, wa + c), t, a0)
        b0 = vfma(vload(w, wb + c), t, b0)
    vstore(acc, ia, a0)
    vstore(acc, ia + LANES, b0)


@njit(cache=True, inline="always")
def _one_row(w, wa, x, x0, c0, c1, acc, ia):  # pragma: no cover (compiled)
    """One chain carried over columns c0..c1: the decoded weight row at w[wa:] against one x row."""
    a0 = vload(acc, ia)  # (8,)
    for c in range(c0, c1, LANES):
        a0 = vfma(vload(w, wa + c), vload(x, x0 + c), a0)
    vstore(acc, ia, a0)


@njit(parallel=True, nogil=True, cache=True)
def _wide(packed, scale, offset, x, out):  # pragma: no cover (compiled)
    """out[k, r] = w[r] . x[k] for many rows of x: DECODED_TILE weight rows decoded per task, register tiles over
    spans of COLUMN_SPAN columns (the chains wait in `acc` between spans, so x's span stays in L1)."""
    rows, half = packed.shape  # packed (R, C/2) uint8; scale/offset (R, C/32); x (K, C)
    cols = 2 * half
    n_rows = x.shape[0]
    flat = packed.reshape(-1)  # (R*C/2,)
    flat_x = x.reshape(-1)  # (K*C,)
    sixes = n_rows // 6
    if n_rows % 6 == 2 and sixes > 0:
        sixes -= 1  # 6k+2 rows: two fours instead of two singles
    fours = (n_rows - 6 * sixes) // 4
    for tile in prange((rows + DECODED_TILE - 1) // DECODED_TILE):
        first = tile * DECODED_TILE
        count = min(rows, first + DECODED_TILE) - first
        w = np.empty(count * cols, np.float32)  # (T*C,) this tile's weight rows, decoded
        for j in range(count):
            _decode_row(flat, scale, offset, first + j, half, w, j * cols)
        stride = count * LANES
        acc = np.zeros(n_rows * stride, np.float32)  # (K*T*8,) every chain of the tile, between spans
        pairs = count // 2
        for c0 in range(0, cols, COLUMN_SPAN):
            c1 = min(cols, c0 + COLUMN_SPAN)
            for six in range(sixes):  # six rows of x against every pair of the tile's weight rows
                for p in range(pairs):
                    _two_by_six(w, 2 * p * cols, flat_x, 6 * six * cols, cols, c0, c1, acc,
                                6 * six * stride + 2 * p * LANES, stride)
            for four in range(fours):
                k = 6 * sixes + 4 * four
                for p in range(pairs):
                    _two_by_four(w, 2 * p * cols, flat_x, k * cols, cols, c0, c1, acc, k * stride + 2 * p * LANES,
                                 stride)
            for k in range(6 * sixes + 4 * fours, n_rows):
                for p in range(pairs):
                    _two_by_one(w, 2 * p * cols, flat_x, k * cols, cols, c0, c1, acc, k * stride + 2 * p * LANES)
            if count % 2:  # an odd last weight row
                for k in range(n_rows):
                    _one_row(w, (count - 1) * cols, flat_x, k * cols, c0, c1, acc, k * stride + (count - 1) * LANES)
        for k in range(n_rows):
            for j in range(count):
                out[k, first + j] = vsum(vload(acc, k * stride + j * LANES))


def packed_matmul(x: np.ndarray, packed: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """x (K, C) times the packed matrix (R, C) transposed (packed (R, C/2), tables (R, C/32)): (K, R), row-major."""
    n_rows, cols = x.shape
    if packed.shape[1] * 2 != cols or scale.shape[1] * NIBBLE_BLOCK != cols:
        raise ValueError(f"packed codes {packed.shape} and tables {scale.shape} do not fit x {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)  # (K, C)
    out = np.empty((n_rows, packed.shape[0]), np.float32)  # (K, R)
    kernel = _wide if n_rows >= WIDE_ROWS else _narrow
    with launch_lock:
        kernel(np.ascontiguousarray(packed), scale, offset, x, out)
    return out


def warm() -> None:
    """Compile (or load from numba's cache) both kernels for writeable and for read-only (mapped) codes."""
    for writeable in (True, False):
        packed = np.zeros((2, NIBBLE_BLOCK // 2), np.uint8)  # (R, C/2)
        tables = np.zeros((2, 1), np.float32)  # (R, C/32)
        packed.flags.writeable = tables.flags.writeable = writeable
        packed_matmul(np.zeros((3, NIBBLE_BLOCK), np.float32), packed, tables, tables)
        packed_matmul(np.zeros((WIDE_ROWS, NIBBLE_BLOCK), np.float32), packed, tables, tables)
