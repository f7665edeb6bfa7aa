"""Integer matmuls over K-quant super-blocks (k_blocks.py): x (N, C) times a Q4_K, Q5_K or Q6_K matrix (R, C)
transposed, with x quantized to int8 per 64 columns (llama.cpp's Q8_K has one scale per 256; a finer one keeps our
error well inside llama.cpp's at about the same speed) and every product of codes and activations summed in integers
(simd_int.py: vpmaddubsw + vpmaddwd on AVX2). One kernel serves every width, decode and prefill alike.

THE REDUCTION (every tile computes exactly this, so a row's result never depends on the rest of its step):

    activations, per row k and quarter super-block h (64 columns): dx = max|x| / 127,
      q = rint(x * (127 / max|x|)) (0 when max is 0); dx8[k, s] = dx[k, 4s..4s+3] twice (8 lanes);
      sums32[k, j], sums16[k, j]: int16 sums of q over column group j of 32 and of 16 (sums16 in PAIRED_GROUPS
      order within each super-block);
    per weight row r, x row k, super-block s, in order s = 0, 1, ..:
      w[h]     = sum over the 16 columns 0..15 of quarter h's two 32-column blocks b of sc(b) * code * q  (h < 4)
      w[4 + h] = the same over columns 16..31 of each block     (integers, exact: simd_int.dot_scaled, hsum_quarters)
      Q6_K (codes are unsigned: the -32 comes off here, in integers): w[h] -= 32 * (sc[4h] S16[4h] + sc[4h+2]
            S16[4h+2]), w[4+h] -= 32 * (sc[4h+1] S16[4h+1] + sc[4h+3] S16[4h+3])  (groups of 16 in the super-block)
      acc = fma(float(w), d[r, s] * dx8[k, s], acc)
      Q4_K, Q5_K: macc = fma(float(mn), -dmin[r, s] * dx8[k, s], macc), mn[h] = m[2h] S32[2h] + m[2h+1] S32[2h+1] for
            h < 4 (groups of 32 in the super-block), mn[4..7] = 0  (a chain of its own: the two overlap)
    out[k, r] = vsum(acc)  (Q4_K, Q5_K: vsum(acc) + vsum(macc))

`reference_matmul` is the same arithmetic in numpy. Parallelism: ROWS_PER_TASK weight rows a task, tasks across
threads; every (r, k) pair is one chain, computed by one thread in one order. Only the loop order depends on the
step's width: one row, each weight row's two chains stay in registers over its super-blocks (single-stream decode
is then bound by memory bandwidth); up to X_TILE rows, a task reads each weight row through, its chains in a scratch
(decode: the weights stream once); wider, it carries tiles of X_TILE x rows over one super-block of all its weight
rows at a time (prefill: the tile's int8 activations stay in L1). With more than one row, a super-block's eight
sub-scale vectors are splatted once into an L1 scratch that every row's products read (AVX2's sixteen registers
hold its eight code vectors, not both). From TILE_MIN rows on, a task's sixteen weight rows go through int_tiles.py's
interleaved tiles instead: the same arithmetic with eight rows side by side in each vector (fewer multiplies; every
kind), or on the avx512vnni path wide_tiles.py's, sixteen rows a 512-bit vector.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from worker.engine.int8_spans import fma32, quantize_span, reference_spans
from worker.engine.int_tiles import TILE_ROWS, q6k_task, q45k_task
from worker.engine.k_blocks import K_KINDS, KBlocks
from worker.engine.numba_runtime import launch_lock
from worker.engine.quant_blocks import QK_K
from worker.engine.simd import LANES, vbroadcast, vfma, vload, vmul, vstore, vsum, vzero
from worker.engine.simd_int import (
    KERNEL_CACHE,
    PAIRED_GROUPS,
    PATHS,
    dot_scaled,
    high_nibbles32,
    hsum_quarters,
    iadd,
    ifloat,
    int_path,
    isplat16,
    isub,
    load_splats,
    low_nibbles32,
    mins_dot,
    mins_vector,
    pair_splats16,
    paired_dot,
    paired_scales,
    store_splats,
    with_high_bits,
)
from worker.engine.wide_tiles import wide_q6k_task, wide_q45k_task

ROW_CHUNK = 256  # x rows per launch (bounds the int8 copy of x a launch reads)
X_TILE = 16  # x rows a task carries over a super-block at once in a wider step (their 16 * 256 int8 stay in L1
# across the task's weight rows); a step of at most this many rows reads each weight row through in turn instead
ROWS_PER_TASK = 16  # weight rows a parallel task takes (one scratch allocation each)
WIDE = int_path() == "avx512vnni"  # the tiles take wide_tiles.py's 512-bit VNNI form (a constant of the kernels)
TILE_MIN = 4 if WIDE else 12  # steps of this many rows or more take the tiles (the eight-row tiles' unpacking is
# repaid from 12 rows on; the wide tiles' from 4: 1.06-1.39x the row-major loops at 4 to 8 rows, 0.80-0.95x at 2-3)
ACT_BLOCK = 64  # activation columns per int8 scale (four per super-block)
_NO_FIFTH_BITS = np.zeros((1, 0), np.uint8)  # Q4_K's stand-in for Q5_K's fifth bits (one compiled kernel serves both)
_CACHE = KERNEL_CACHE
PAIRED_POSITION = np.argsort(np.array(PAIRED_GROUPS))  # where group j of a super-block's 16 sits in sums16
log = logging.getLogger(__name__)


@njit(nogil=True, cache=True)
def _quantize(x, q, dx, dx8, sums16, sums32):  # pragma: no cover (compiled)
    """q, dx, dx8 and the sums over 16 and 32 columns of every row of x (N, C), as the module docstring defines them."""
    n_rows, cols = x.shape
    for k in range(n_rows):
        for h in range(cols // ACT_BLOCK):
            dx[k, h] = quantize_span(x, k, h * ACT_BLOCK, (h + 1) * ACT_BLOCK, q)
            dx8[k, h // 4, h % 4] = dx8[k, h // 4, 4 + h % 4] = dx[k, h]
        for j in range(cols // 16):
            total = np.int16(0)
            for c in range(16 * j, 16 * j + 16):
                total += np.int16(q[k, c])
            sums16[k, j - j % 16 + PAIRED_POSITION[j % 16]] = total
        for j in range(cols // 32):
            total = np.int16(0)
            for c in range(32 * j, 32 * j + 32):
                total += np.int16(q[k, c])
            sums32[k, j] = total


class Int8Rows(NamedTuple):
    """x quantized for the kernels (the module docstring's names)."""

    q: np.ndarray  # (N, C) int8
    dx: np.ndarray  # (N, C/64) float32
    dx8: np.ndarray  # (N, C/256, 8) float32
    sums16: np.ndarray  # (N, C/16) int16, PAIRED_GROUPS order within each super-block
    sums32: np.ndarray  # (N, C/32) int16


def quantize_rows(x: np.ndarray) -> Int8Rows:
    """x (N, C) float32 as int8 codes with their scales and group sums (Int8Rows)."""
    n_rows, cols = x.shape
    rows = Int8Rows(np.empty((n_rows, cols), np.int8), np.empty((n_rows, cols // ACT_BLOCK), np.float32),
                    np.empty((n_rows, cols // QK_K, LANES), np.float32), np.empty((n_rows, cols // 16), np.int16),
                    np.empty((n_rows, cols // 32), np.int16))
    _quantize(np.ascontiguousarray(x, dtype=np.float32), *rows)
    return rows


@njit(cache=_CACHE, inline="always")
def _quarters(flat_q, qa, c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7):  # pragma: no cover
    """w of the module docstring (before Q6_K's -32): the super-block's codes c0..c7 (int8x32) with their
    sub-scales s0..s7 (int16x16) against the 256 activations at flat_q[qa]."""
    t0 = iadd(dot_scaled(c0, flat_q, qa, s0), dot_scaled(c1, flat_q, qa + 32, s1))
    t1 = iadd(dot_scaled(c2, flat_q, qa + 64, s2), dot_scaled(c3, flat_q, qa + 96, s3))
    t2 = iadd(dot_scaled(c4, flat_q, qa + 128, s4), dot_scaled(c5, flat_q, qa + 160, s5))
    t3 = iadd(dot_scaled(c6, flat_q, qa + 192, s6), dot_scaled(c7, flat_q, qa + 224, s7))
    return hsum_quarters(t0, t1, t2, t3)


@njit(cache=_CACHE, inline="always")
def _q45k_codes(flat_codes, flat_fifth, at, fa):  # pragma: no cover (compiled)
    """The eight blocks' codes (int8x32 each) of a Q4_K super-block at flat_codes[at], or of a Q5_K one when
    flat_fifth holds its fifth bits (from fa on)."""
    c0, c1 = low_nibbles32(flat_codes, at), high_nibbles32(flat_codes, at)
    c2, c3 = low_nibbles32(flat_codes, at + 32), high_nibbles32(flat_codes, at + 32)
    c4, c5 = low_nibbles32(flat_codes, at + 64), high_nibbles32(flat_codes, at + 64)
    c6, c7 = low_nibbles32(flat_codes, at + 96), high_nibbles32(flat_codes, at + 96)
    if flat_fifth.size:
        c0, c1 = with_high_bits(c0, flat_fifth, fa, 0, 1), with_high_bits(c1, flat_fifth, fa, 1, 1)
        c2, c3 = with_high_bits(c2, flat_fifth, fa, 2, 1), with_high_bits(c3, flat_fifth, fa, 3, 1)
        c4, c5 = with_high_bits(c4, flat_fifth, fa, 4, 1), with_high_bits(c5, flat_fifth, fa, 5, 1)
        c6, c7 = with_high_bits(c6, flat_fifth, fa, 6, 1), with_high_bits(c7, flat_fifth, fa, 7, 1)
    return c0, c1, c2, c3, c4, c5, c6, c7


@njit(cache=_CACHE, inline="always")
def _q45k_scales(scales, r, g):  # pragma: no cover (compiled)
    """The sub-scales of a Q4_K or Q5_K super-block's eight blocks, scales[r, g..g+7], each as an int16x16."""
    return (isplat16(scales[r, g], scales[r, g]), isplat16(scales[r, g + 1], scales[r, g + 1]),
            isplat16(scales[r, g + 2], scales[r, g + 2]), isplat16(scales[r, g + 3], scales[r, g + 3]),
            isplat16(scales[r, g + 4], scales[r, g + 4]), isplat16(scales[r, g + 5], scales[r, g + 5]),
            isplat16(scales[r, g + 6], scales[r, g + 6]), isplat16(scales[r, g + 7], scales[r, g + 7]))


@njit(cache=_CACHE, inline="always")
def _with_mins(codes, subs, m, scale, negative_min, flat_q, flat_dx8, flat_sums, k, s, cols, acc,
               macc):  # pragma: no cover (compiled)
    """acc and macc (float32x8 each) of x row k carried over super-block s of a Q4_K or Q5_K weight row: its codes and
    sub-scales (eight each), its mins (mins_vector), d and -dmin broadcast."""
    c0, c1, c2, c3, c4, c5, c6, c7 = codes
    s0, s1, s2, s3, s4, s5, s6, s7 = subs
    w = _quarters(flat_q, k * cols + s * QK_K, c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7)
    dxs = vload(flat_dx8, (k * (cols // QK_K) + s) * LANES)  # (8,)
    mn = mins_dot(m, flat_sums, k * (cols // 32) + 8 * s)  # (8,) int32
    return vfma(ifloat(w), vmul(scale, dxs), acc), vfma(ifloat(mn), vmul(negative_min, dxs), macc)


@njit(cache=_CACHE, inline="always")
def _q45k_super(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums, r, s, half, first, n,
                acc, macc, base, splat_scratch):  # pragma: no cover
    """Super-block s of Q4_K or (when flat_fifth holds fifth bits) Q5_K weight row r against n x rows: their chains
    in acc and macc (n*8,) from `base` on, carried over it (its codes unpacked once for all n; its sub-scales splatted
    once into splat_scratch (128,), which each row's products read from L1)."""
    cols = 2 * half
    codes = _q45k_codes(flat_codes, flat_fifth, r * half + s * (QK_K // 2), r * (half // 4) + s * (QK_K // 8))
    store_splats(splat_scratch, _q45k_scales(scales, r, 8 * s))
    m = mins_vector(flat_mins, r * (cols // 32) + 8 * s)  # (16,) int16: the super-block's mins, then zeros
    scale = vbroadcast(d[r, s])  # (8,)
    negative_min = vbroadcast(-dmin[r, s])  # (8,)
    for i in range(n):
        at = base + i * LANES
        a, b = _with_mins(codes, load_splats(splat_scratch), m, scale, negative_min, flat_q, flat_dx8, flat_sums,
                          first + i, s, cols, vload(acc, at), vload(macc, at))
        vstore(acc, at, a)
        vstore(macc, at, b)


@njit(cache=_CACHE, inline="always")
def _q45k_row(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums, r, half,
              k):  # pragma: no cover (compiled)
    """out[k, r] for one x row k and Q4_K or Q5_K weight row r, its two chains in registers (a one-row step: the
    same arithmetic as _q45k_super's, with nothing stored between super-blocks)."""
    cols = 2 * half
    acc = vzero()  # (8,)
    macc = vzero()  # (8,)
    for s in range(cols // QK_K):
        codes = _q45k_codes(flat_codes, flat_fifth, r * half + s * (QK_K // 2), r * (half // 4) + s * (QK_K // 8))
        m = mins_vector(flat_mins, r * (cols // 32) + 8 * s)  # (16,) int16
        acc, macc = _with_mins(codes, _q45k_scales(scales, r, 8 * s), m, vbroadcast(d[r, s]), vbroadcast(-dmin[r, s]),
                               flat_q, flat_dx8, flat_sums, k, s, cols, acc, macc)
    return vsum(acc) + vsum(macc)


@njit(parallel=True, nogil=True, cache=_CACHE)
def _q4k(codes, fifth, scales, mins, d, dmin, q, dx8, sums32, first, last, out):  # pragma: no cover (compiled)
    """out[k, r] for x rows first..last-1: the Q4_K (or Q5_K) reduction of the module docstring (a super-block's
    codes unpacked once per tile of x rows, then met by each of them; ROWS_PER_TASK weight rows a task, sharing its
    scratch)."""
    rows, half = codes.shape  # codes (R, C/2); fifth (R, C/8) or empty; scales/mins (R, C/32) uint8; d/dmin (R, C/256)
    flat_codes = codes.reshape(-1)  # (R*C/2,)
    flat_fifth = fifth.reshape(-1)  # (R*C/8,) or (0,)
    flat_q = q.reshape(-1)  # (N*C,)
    flat_dx8 = dx8.reshape(-1)  # (N*C/256*8,)
    flat_sums = sums32.reshape(-1)  # (N*C/32,)
    flat_mins = mins.reshape(-1)  # (R*C/32,)
    flat_out = out.reshape(-1)  # (N*R,)
    supers = half // (QK_K // 2)
    rows_outer = last - first <= X_TILE  # a decode step: each weight row read through in turn, which streams best
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        low, high = task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)
        if last - first == 1:  # a one-row step: each row's chains stay in registers
            for r in range(low, high):
                out[first, r] = _q45k_row(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8,
                                          flat_sums, r, half, first)
            continue
        if last - first >= TILE_MIN and high - low == 2 * TILE_ROWS:  # sixteen rows: tiles
            if WIDE:  # one 512-bit tile (wide_tiles.py)
                wide_q45k_task(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums,
                               flat_out, half, low, first, last)
            else:  # two tiles of eight rows (int_tiles.py)
                q45k_task(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums, flat_out,
                          half, low, first, last)
            continue
        acc = np.empty((high - low) * X_TILE * LANES, np.float32)  # (rows*tile*8,) a chain per weight row and x row
        macc = np.empty((high - low) * X_TILE * LANES, np.float32)  # (rows*tile*8,) the mins' chains
        splat_scratch = np.empty(8 * 16, np.int16)  # (128,) a super-block's sub-scales, splatted
        for x0 in range(first, last, X_TILE):
            n = min(X_TILE, last - x0)
            acc[: (high - low) * n * LANES] = 0  # only the chains this tile uses
            macc[: (high - low) * n * LANES] = 0
            for a in range(high - low if rows_outer else supers):  # the loop order only: each chain is the same
                for b in range(supers if rows_outer else high - low):
                    if rows_outer:
                        _q45k_super(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums,
                                    low + a, b, half, x0, n, acc, macc, a * n * LANES, splat_scratch)
                    else:
                        _q45k_super(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums,
                                    low + b, a, half, x0, n, acc, macc, b * n * LANES, splat_scratch)
            for r in range(low, high):
                for i in range(n):
                    at = ((r - low) * n + i) * LANES
                    out[x0 + i, r] = vsum(vload(acc, at)) + vsum(vload(macc, at))


@njit(cache=_CACHE, inline="always")
def _q6k_codes(flat_low, flat_high, at, ha):  # pragma: no cover (compiled)
    """The eight blocks' codes (int8x32 each, 0..63) of a Q6_K super-block: low four bits from flat_low[at], bits
    4-5 from flat_high[ha] (32 bytes a half)."""
    return (with_high_bits(low_nibbles32(flat_low, at), flat_high, ha, 0, 3),
            with_high_bits(low_nibbles32(flat_low, at + 32), flat_high, ha, 2, 3),
            with_high_bits(high_nibbles32(flat_low, at), flat_high, ha, 4, 3),
            with_high_bits(high_nibbles32(flat_low, at + 32), flat_high, ha, 6, 3),
            with_high_bits(low_nibbles32(flat_low, at + 64), flat_high, ha + 32, 0, 3),
            with_high_bits(low_nibbles32(flat_low, at + 96), flat_high, ha + 32, 2, 3),
            with_high_bits(high_nibbles32(flat_low, at + 64), flat_high, ha + 32, 4, 3),
            with_high_bits(high_nibbles32(flat_low, at + 96), flat_high, ha + 32, 6, 3))


@njit(cache=_CACHE, inline="always")
def _q6k_step(codes, subs, offsets, scale, flat_q, flat_dx8, flat_sums, k, s, cols, acc):  # pragma: no cover
    """acc (float32x8) of x row k carried over super-block s of a Q6_K weight row: its codes and sub-scales (eight
    each), its paired_scales and d broadcast."""
    c0, c1, c2, c3, c4, c5, c6, c7 = codes
    s0, s1, s2, s3, s4, s5, s6, s7 = subs
    w = _quarters(flat_q, k * cols + s * QK_K, c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7)
    w = isub(w, paired_dot(offsets, flat_sums, k * (cols // 16) + 16 * s))  # (8,) int32: the codes' -32
    dxs = vload(flat_dx8, (k * (cols // QK_K) + s) * LANES)  # (8,)
    return vfma(ifloat(w), vmul(scale, dxs), acc)


@njit(cache=_CACHE, inline="always")
def _q6k_super(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, r, s, half, first, n, acc,
               base, splat_scratch):  # pragma: no cover
    """Super-block s of weight row r against n x rows: their chains in acc (n*8,) from `base` on, carried over it
    (sub-scales through splat_scratch, as in _q45k_super)."""
    cols = 2 * half
    codes = _q6k_codes(flat_low, flat_high, r * half + s * (QK_K // 2), r * (cols // 4) + s * (QK_K // 4))
    store_splats(splat_scratch, pair_splats16(flat_scales, r * (cols // 16) + 16 * s))
    offsets = paired_scales(flat_scales, r * (cols // 16) + 16 * s)  # (16,) int16: 32 * sub-scales, paired
    scale = vbroadcast(d[r, s])  # (8,)
    for i in range(n):
        at = base + i * LANES
        vstore(acc, at, _q6k_step(codes, load_splats(splat_scratch), offsets, scale, flat_q, flat_dx8, flat_sums,
                                  first + i, s, cols, vload(acc, at)))


@njit(cache=_CACHE, inline="always")
def _q6k_row(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, r, half,
             k):  # pragma: no cover (compiled)
    """out[k, r] for one x row k and Q6_K weight row r, its chain in registers (as _q45k_row)."""
    cols = 2 * half
    acc = vzero()  # (8,)
    for s in range(cols // QK_K):
        codes = _q6k_codes(flat_low, flat_high, r * half + s * (QK_K // 2), r * (cols // 4) + s * (QK_K // 4))
        g = r * (cols // 16) + 16 * s  # the super-block's first sub-scale
        acc = _q6k_step(codes, pair_splats16(flat_scales, g), paired_scales(flat_scales, g), vbroadcast(d[r, s]),
                        flat_q, flat_dx8, flat_sums, k, s, cols, acc)
    return vsum(acc)


@njit(parallel=True, nogil=True, cache=_CACHE)
def _q6k(codes, high, scales, d, q, dx8, sums16, first, last, out):  # pragma: no cover (compiled)
    """out[k, r] for x rows first..last-1: the Q6_K reduction of the module docstring."""
    rows, half = codes.shape  # codes (R, C/2); high (R, C/4); scales (R, C/16) int8; d (R, C/256)
    flat_low = codes.reshape(-1)  # (R*C/2,)
    flat_high = high.reshape(-1)  # (R*C/4,)
    flat_scales = scales.reshape(-1)  # (R*C/16,)
    flat_q = q.reshape(-1)  # (N*C,)
    flat_dx8 = dx8.reshape(-1)  # (N*C/256*8,)
    flat_sums = sums16.reshape(-1)  # (N*C/16,)
    flat_out = out.reshape(-1)  # (N*R,)
    supers = half // (QK_K // 2)
    rows_outer = last - first <= X_TILE  # as in _q4k
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        low, high = task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)
        if last - first == 1:  # as in _q4k
            for r in range(low, high):
                out[first, r] = _q6k_row(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, r,
                                         half, first)
            continue
        if last - first >= TILE_MIN and high - low == 2 * TILE_ROWS:  # as in _q4k
            if WIDE:
                wide_q6k_task(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, flat_out, half, low,
                              first, last)
            else:
                q6k_task(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, flat_out, half, low, first,
                         last)
            continue
        acc = np.empty((high - low) * X_TILE * LANES, np.float32)  # (rows*tile*8,)
        splat_scratch = np.empty(8 * 16, np.int16)  # (128,) as in _q4k
        for x0 in range(first, last, X_TILE):
            n = min(X_TILE, last - x0)
            acc[: (high - low) * n * LANES] = 0
            for a in range(high - low if rows_outer else supers):  # the loop order only: each chain is the same
                for b in range(supers if rows_outer else high - low):
                    if rows_outer:
                        _q6k_super(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, low + a, b,
                                   half, x0, n, acc, a * n * LANES, splat_scratch)
                    else:
                        _q6k_super(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, low + b, a,
                                   half, x0, n, acc, b * n * LANES, splat_scratch)
            for r in range(low, high):
                for i in range(n):
                    out[x0 + i, r] = vsum(vload(acc, ((r - low) * n + i) * LANES))


def k_matmul(x: np.ndarray, blocks: KBlocks) -> np.ndarray:
    """x (N, C) times the K-quant matrix (R, C) transposed: (N, R), row-major."""
    n_rows, cols = x.shape
    if blocks.shape[1] != cols or cols % QK_K:
        raise ValueError(f"{blocks.kind} matrix {blocks.shape} does not fit x {x.shape}")
    rows = quantize_rows(x)
    out = np.empty((n_rows, blocks.shape[0]), np.float32)  # (N, R)
    with launch_lock:
        for first in range(0, n_rows, ROW_CHUNK):
            last = min(n_rows, first + ROW_CHUNK)
            if blocks.kind != "Q6_K":
                fifth = _NO_FIFTH_BITS if blocks.high is None else blocks.high
                _q4k(blocks.codes, fifth, blocks.scales, blocks.mins, blocks.d, blocks.dmin, rows.q, rows.dx8,
                     rows.sums32, first, last, out)
            else:
                _q6k(blocks.codes, blocks.high, blocks.scales, blocks.d, rows.q, rows.dx8, rows.sums16, first, last,
                     out)
    return out


def reference_quantize(x: np.ndarray) -> Int8Rows:
    """quantize_rows in numpy."""
    q, dx = reference_spans(x, ACT_BLOCK)  # (N, C), (N, H)
    n_rows, cols = q.shape
    dx8 = np.tile(dx.reshape(n_rows, cols // QK_K, 4), (1, 1, 2))  # (N, S, 8)
    sums16 = q.reshape(n_rows, cols // 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)  # (N, C/16)
    paired = sums16.reshape(n_rows, cols // QK_K, 16)[:, :, list(PAIRED_GROUPS)].reshape(n_rows, cols // 16)
    sums32 = q.reshape(n_rows, cols // 32, 32).astype(np.int16).sum(axis=2, dtype=np.int16)  # (N, C/32)
    return Int8Rows(q, dx, dx8, paired, sums32)


def _vsum(acc: np.ndarray) -> np.ndarray:
    """simd.vsum over the last axis (8 lanes) in float32."""
    half = acc[..., :4] + acc[..., 4:]  # (.., 4)
    quarter = half[..., :2] + half[..., 2:]  # (.., 2)
    return quarter[..., 0] + quarter[..., 1]


def reference_matmul(x: np.ndarray, blocks: KBlocks) -> np.ndarray:
    """k_matmul's arithmetic in numpy, step by step: (N, R)."""
    rows_q = reference_quantize(x)
    rows, cols = blocks.shape
    n_rows, supers = x.shape[0], cols // QK_K
    codes = blocks.code_rows().astype(np.int64).reshape(rows, 1, supers, 8, 2, 16)  # (R, 1, S, block, half, 16)
    q = rows_q.q.astype(np.int64).reshape(1, n_rows, supers, 8, 2, 16)  # (1, N, S, block, half, 16)
    products = (codes * q).sum(axis=5)  # (R, N, S, block, half)
    scales = blocks.scales.astype(np.int64)
    if blocks.kind != "Q6_K":
        per_block = scales.reshape(rows, 1, supers, 8, 1)  # (R, 1, S, block, 1)
    else:  # a block's first 16 columns are one group, its last 16 the next
        per_block = scales.reshape(rows, 1, supers, 8, 2)  # (R, 1, S, block, half)
    quarters = (products * per_block).reshape(rows, n_rows, supers, 4, 2, 2).sum(axis=4)  # (R, N, S, h, half)
    w = quarters.transpose(0, 1, 2, 4, 3).reshape(rows, n_rows, supers, LANES)  # (R, N, S, 8): lane 4*half + h
    sums16 = rows_q.sums16.astype(np.int64).reshape(n_rows, supers, 16)[:, :, np.argsort(PAIRED_GROUPS)]
    if blocks.kind == "Q6_K":  # group 4h + 2b + half is block 2h + b's half: it lands in lane 4 * half + h
        groups = scales.reshape(rows, 1, supers, 4, 2, 2) * sums16.reshape(1, n_rows, supers, 4, 2, 2)  # h, b, half
        w = w - 32 * groups.sum(axis=4).transpose(0, 1, 2, 4, 3).reshape(rows, n_rows, supers, LANES)
    factor = (blocks.d[:, None, :, None] * rows_q.dx8[None, :, :, :]).astype(np.float32)  # (R, N, S, 8)
    acc = np.zeros((rows, n_rows, LANES), np.float32)  # (R, N, 8)
    macc = np.zeros((rows, n_rows, LANES), np.float32)  # (R, N, 8)
    for s in range(supers):
        acc = fma32(w[:, :, s].astype(np.float32), factor[:, :, s], acc)
        if blocks.kind != "Q6_K":  # lane h < 4: the mins of quarter h's two groups of 32
            assert blocks.mins is not None and blocks.dmin is not None
            low = blocks.mins.astype(np.int64)[:, None, 8 * s : 8 * s + 8] * rows_q.sums32[None, :, 8 * s : 8 * s + 8]
            mn = np.concatenate([low.reshape(rows, n_rows, 4, 2).sum(axis=3), np.zeros((rows, n_rows, 4), np.int64)],
                                axis=2)  # (R, N, 8)
            negative = (-blocks.dmin[:, None, s, None] * rows_q.dx8[None, :, s, :]).astype(np.float32)  # (R, N, 8)
            macc = fma32(mn.astype(np.float32), negative, macc)
    return np.ascontiguousarray((_vsum(acc) + _vsum(macc)).T)  # (N, R)


def warm() -> None:
    """Compile (or load from numba's cache) both kernels for writeable and for read-only (mapped) arrays, and log
    the instruction path once."""
    log.info("integer kernels: %s path (LLMFLEET_INT_KERNELS=%s forces one)", int_path(), "|".join(PATHS))
    for kind in K_KINDS:
        for writeable in (True, False):
            blocks = _zero_blocks(kind)
            for array in blocks.arrays().values():
                array.flags.writeable = writeable
            k_matmul(np.zeros((1, QK_K), np.float32), blocks)


def _zero_blocks(kind: str) -> KBlocks:
    """A one-row zero matrix of a kind (for warming the kernels)."""
    rows = 1
    if kind != "Q6_K":
        fifth = np.zeros((rows, QK_K // 8), np.uint8) if kind == "Q5_K" else None
        return KBlocks(kind, np.zeros((rows, QK_K // 2), np.uint8), np.zeros((rows, 8), np.uint8),
                       np.zeros((rows, 1), np.float32), high=fifth, mins=np.zeros((rows, 8), np.uint8),
                       dmin=np.zeros((rows, 1), np.float32))
    return KBlocks(kind, np.zeros((rows, QK_K // 2), np.uint8), np.zeros((rows, 16), np.int8),
                   np.zeros((rows, 1), np.float32), high=np.zeros((rows, QK_K // 4), np.uint8))
