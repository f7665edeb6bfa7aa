"""The general path of interleaved_k_matmul: each super-block of a row group's sixteen rows unpacked once (nibbles
split, Q5_K's and Q6_K's high bits joined) into an L1 scratch of one code a byte, then met by the pass's x rows four at
a time (each code vector loaded once for four rows), the codes of a super-block a few ahead asked for meanwhile
(prefetch). Q5_K at every width and Q4_K and Q6_K from five rows on (prefill, wide decode steps) take it. I, M and the
float chain are interleaved_k_matmul's module docstring's, bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from worker.engine.kernels.interleaved_k_single import carry
from worker.engine.kernels.simd_int import KERNEL_CACHE, prefetch_run
from worker.engine.kernels.simd_scales import wload_scales
from worker.engine.kernels.simd_wide import (
    wdot4,
    wdot_words,
    wfbroadcast,
    wfloat,
    wfma,
    wfmul,
    wfzero,
    whigh4,
    wload_codes,
    wload_widened,
    wload_word_pairs,
    wlow4,
    wlow_words,
    wmadd_words,
    wpair_splat,
    wquad_splat,
    wsplat_at,
    wstore_codes,
    wtop_bits,
    wzero,
)
from worker.engine.weights.interleaved_k_blocks import TILE_ROWS, VECTOR_BYTES
from worker.engine.weights.quant_blocks import QK_K

X_TILE = 4  # x rows met by each code vector load
PREFETCH_SUPERS = 4  # super-blocks ahead whose codes the scratch path asks for
UNPACKED = 64 * VECTOR_BYTES  # bytes of one super-block's codes of sixteen rows, one a byte


@njit(inline="always", cache=KERNEL_CACHE)
def _unpack(flat_low, flat_high, table, scratch, bits):  # pragma: no cover (compiled)
    """Super-block `table`'s codes, one a byte, into scratch: vector 8j + c holds columns 32j + 4c .. 32j + 4c + 3
    (c < 8) of each row, from the file's bytes (k_blocks.py): byte i of a Q4_K or Q5_K part p holds columns 64p + i
    and 64p + 32 + i, of a Q6_K quarter q = 2t + m columns 128t + 32m + i and 128t + 64 + 32m + i, in its low and
    high nibbles; Q5_K's fifth-bit byte i holds column 32j + i in bit j, Q6_K's byte 32t + i columns 128t + 32k + i
    in bits 2k, 2k + 1. `bits` (a constant): 4, 5 or 6."""
    for v in range(32):
        packed = wload_codes(flat_low, (table * 32 + v) * VECTOR_BYTES)  # (64,) code bytes 4v .. 4v + 3
        low, high = wlow4(packed), whigh4(packed)  # (64,) each
        quarter, c = v // 8, v % 8
        first = 4 * (quarter // 2) + quarter % 2 if bits == 6 else 2 * quarter  # the low nibbles' block
        second = first + 2 if bits == 6 else first + 1  # the high nibbles' block
        if bits == 5:
            fifth = wload_codes(flat_high, (table * 8 + c) * VECTOR_BYTES)  # (64,)
            low, high = wtop_bits(low, fifth, first, 1), wtop_bits(high, fifth, second, 1)
        elif bits == 6:
            top = wload_codes(flat_high, (table * 16 + 8 * (first // 4) + c) * VECTOR_BYTES)  # (64,)
            low, high = wtop_bits(low, top, 2 * (first % 4), 3), wtop_bits(high, top, 2 * (second % 4), 3)
        wstore_codes(scratch, (8 * first + c) * VECTOR_BYTES, low)
        wstore_codes(scratch, (8 * second + c) * VECTOR_BYTES, high)


@njit(inline="always", cache=KERNEL_CACHE)
def _products(scratch, at, flat_q, a0, a1, a2, a3, v0, v1, v2, v3, first, count):  # pragma: no cover (compiled)
    """v_i + (lane r: the products of row r's codes in scratch vectors first .. first + count - 1 from `at` (four
    columns each) and x row i's activations from flat_q[a_i]) for four x rows."""
    for c in range(first, first + count):
        code = wload_codes(scratch, at + c * VECTOR_BYTES)  # (64,)
        v0 = wdot4(v0, code, wquad_splat(flat_q, a0 + 4 * c))  # (16,)
        v1 = wdot4(v1, code, wquad_splat(flat_q, a1 + 4 * c))  # (16,)
        v2 = wdot4(v2, code, wquad_splat(flat_q, a2 + 4 * c))  # (16,)
        v3 = wdot4(v3, code, wquad_splat(flat_q, a3 + 4 * c))  # (16,)
    return v0, v1, v2, v3


@njit(inline="always", cache=KERNEL_CACHE)
def _q45k_quarter(scratch, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0, a1, a2, a3, m0, m1, m2, m3,
                  fifth):  # pragma: no cover (compiled)
    """I and M of quarter h (interleaved_k_matmul's docstring) for four x rows (activations from a_i, S32 pairs at
    m_i). `fifth` (a constant): Q5_K's codes, below 32, take the sub-scale every 8 columns (8 * 31 * 127 < 32768),
    Q4_K's every 16."""
    i0, i1, i2, i3 = wzero(), wzero(), wzero(), wzero()  # (16,) int32 each
    for b in range(2):
        j = 2 * h + b
        sub = wload_widened(flat_scales, (table * 8 + j) * TILE_ROWS)  # (16,) block j's sub-scale of each row
        for t in range(2):
            at, col = (8 * j + 4 * t) * VECTOR_BYTES, 32 * j + 16 * t
            for first in range(0, 4, 2 if fifth else 4):
                zero = wzero()
                v0, v1, v2, v3 = _products(scratch, at, flat_q, a0 + col, a1 + col, a2 + col, a3 + col, zero, zero,
                                           zero, zero, first, 2 if fifth else 4)  # (16,) int32 each
                i0, i1 = wdot_words(i0, v0, sub), wdot_words(i1, v1, sub)
                i2, i3 = wdot_words(i2, v2, sub), wdot_words(i3, v3, sub)
    mins = wload_word_pairs(flat_mins, (table * 4 + h) * 2 * TILE_ROWS)  # (16,) the quarter's two mins of each row
    n0 = wmadd_words(mins, wpair_splat(flat_sums, m0 + 2 * h))  # (16,) int32: M of x row 0
    n1 = wmadd_words(mins, wpair_splat(flat_sums, m1 + 2 * h))
    n2 = wmadd_words(mins, wpair_splat(flat_sums, m2 + 2 * h))
    n3 = wmadd_words(mins, wpair_splat(flat_sums, m3 + 2 * h))
    return i0, i1, i2, i3, n0, n1, n2, n3  # (16,) int32 each


@njit(inline="always", cache=KERNEL_CACHE)
def _q6k_quarter(scratch, flat_scales, table, h, flat_q, flat_offsets, a0, a1, a2, a3, o0, o1, o2,
                 o3):  # pragma: no cover (compiled)
    """I of quarter h (interleaved_k_matmul's docstring) for four x rows (activations from a_i, -32 S8 from o_i):
    each group's two runs of 8 columns start from -32 S8, so their sums of (code - 32) * q stay within
    8 * 32 * 127 < 32768 and vpdpwssd applies the signed sub-scale (its high word cleared)."""
    i0, i1, i2, i3 = wzero(), wzero(), wzero(), wzero()  # (16,) int32 each
    for g in range(4 * h, 4 * h + 4):
        sub = wlow_words(wload_widened(flat_scales, (table * 16 + g) * TILE_ROWS))  # (16,) group g's sub-scale
        at, col = 4 * g * VECTOR_BYTES, 16 * g
        for e in range(2):
            run = 2 * g + e
            v0, v1, v2, v3 = _products(scratch, at, flat_q, a0 + col, a1 + col, a2 + col, a3 + col,
                                       wsplat_at(flat_offsets, o0 + run), wsplat_at(flat_offsets, o1 + run),
                                       wsplat_at(flat_offsets, o2 + run), wsplat_at(flat_offsets, o3 + run), 2 * e,
                                       2)  # (16,) int32 each
            i0, i1 = wdot_words(i0, v0, sub), wdot_words(i1, v1, sub)
            i2, i3 = wdot_words(i2, v2, sub), wdot_words(i3, v3, sub)
    return i0, i1, i2, i3


@njit(inline="always", cache=KERNEL_CACHE)
def _super(scratch, flat_scales, flat_mins, flat_d, flat_dmin, table, flat_q, flat_sums, flat_offsets, dx, s, cols,
           x0, n, chains, bits, single):  # pragma: no cover (compiled)
    """Carry the chains of x rows x0 .. x0 + n - 1 over super-block s (its codes unpacked in scratch; its tables at
    `table`), four x rows at a time (a short last tile repeats its last row into spare chains). Constants: `bits`,
    the codes' (4, 5 or 6: Q4_K, Q5_K, Q6_K); `single`, n is 1."""
    six = bits == 6
    d = wload_scales(flat_d, table * TILE_ROWS)  # (16,)
    negative = wfzero() if six else wfmul(wload_scales(flat_dmin, table * TILE_ROWS), wfbroadcast(np.float32(-1.0)))
    for i in range(0, n, X_TILE):
        k0, k1 = x0 + i, x0 + min(i + 1, n - 1)
        k2, k3 = x0 + min(i + 2, n - 1), x0 + min(i + 3, n - 1)
        a0, a1, a2, a3 = k0 * cols + s * QK_K, k1 * cols + s * QK_K, k2 * cols + s * QK_K, k3 * cols + s * QK_K
        for h in range(4):
            column = 4 * s + h
            if six:
                o = cols // 8
                i0, i1, i2, i3 = _q6k_quarter(scratch, flat_scales, table, h, flat_q, flat_offsets, a0, a1, a2, a3,
                                              k0 * o + 32 * s, k1 * o + 32 * s, k2 * o + 32 * s, k3 * o + 32 * s)
                t0, t1, t2, t3 = wfmul(wfloat(i0), d), wfmul(wfloat(i1), d), wfmul(wfloat(i2), d), wfmul(wfloat(i3), d)
            else:
                m = cols // 32
                i0, i1, i2, i3, n0, n1, n2, n3 = _q45k_quarter(
                    scratch, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0, a1, a2, a3, k0 * m + 8 * s,
                    k1 * m + 8 * s, k2 * m + 8 * s, k3 * m + 8 * s, bits == 5)
                t0 = wfma(wfloat(n0), negative, wfmul(wfloat(i0), d))  # (16,)
                t1 = wfma(wfloat(n1), negative, wfmul(wfloat(i1), d))
                t2 = wfma(wfloat(n2), negative, wfmul(wfloat(i2), d))
                t3 = wfma(wfloat(n3), negative, wfmul(wfloat(i3), d))
            carry(chains, i, t0, dx[k0, column])
            if not single:  # (a constant: with one x row the other three rows' work is dead code)
                carry(chains, i + 1, t1, dx[k1, column])
                carry(chains, i + 2, t2, dx[k2, column])
                carry(chains, i + 3, t3, dx[k3, column])


@njit(inline="always", cache=KERNEL_CACHE)
def _prefetch_codes(flat_low, flat_high, table, bits):  # pragma: no cover (compiled)
    """Ask for super-block `table`'s code bytes (its sixteen rows' low bits, and Q5_K's or Q6_K's high bits) a
    few super-blocks before they are unpacked. With five or more x rows the unpacking and products leave the
    hardware prefetcher behind: asking 4 super-blocks ahead made a 16-row decode step 8% shorter (Xeon; the 1B and
    the Qwen3-4B twin), and changed neither 64 rows nor prefill. On the one- to four-row paths (interleaved_k_single,
    bound by memory) it made steps 12-17% longer, so they do not ask."""
    prefetch_run(flat_low, table * 32 * VECTOR_BYTES, 32 * VECTOR_BYTES)
    if bits != 4:
        planes = 8 if bits == 5 else 16  # vectors of high bits a super-block holds
        prefetch_run(flat_high, table * planes * VECTOR_BYTES, planes * VECTOR_BYTES)


@njit(inline="always", cache=KERNEL_CACHE)
def scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, bits, single):  # pragma: no cover (compiled)
    """The general path: each of row group g's super-blocks unpacked once into scratch, then met by x rows
    x0 .. x0 + n - 1. Constants: `bits` (4, 5 or 6) and `single` (n is 1)."""
    flat_low, flat_high, flat_scales, flat_mins, flat_d, flat_dmin = matrix
    flat_q, flat_sums, flat_offsets, dx = xs
    for s in range(supers):
        table = g * supers + s
        if not single:  # (a constant) one row is bound by memory, where asking ahead measured slower (Q4_K, Q6_K)
            _prefetch_codes(flat_low, flat_high, table + PREFETCH_SUPERS, bits)
        _unpack(flat_low, flat_high, table, scratch, bits)
        _super(scratch, flat_scales, flat_mins, flat_d, flat_dmin, table, flat_q, flat_sums, flat_offsets, dx, s,
               cols, x0, n, chains, bits, single)
