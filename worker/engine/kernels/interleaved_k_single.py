"""One to four x rows of Q4_K or Q6_K straight from the packed bytes of interleaved super-blocks
(interleaved_k_blocks.py): the decode step's paths of interleaved_k_matmul. A decode step meets each code once (one
row) or a few times (two to four), so unpacking a super-block into the L1 scratch first (the path every wider step
takes) only adds loads and stores; here each packed vector's nibbles (and Q6_K's top bits) are split in registers and
multiplied at once by each row (four rows of the 1B's gate and up projection: 0.55 ms against 0.83 through the
scratch, on a Xeon). The integers I and M and the float chain are interleaved_k_matmul' module docstring's, bit for
bit (its reduction is exact in the integers), so a row's result is the same alone and in any step (the kernel tests
check every row count against the reference).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from worker.engine.kernels.simd_int import KERNEL_CACHE
from worker.engine.kernels.simd_scales import wload_scales
from worker.engine.kernels.simd_wide import (
    wdot4,
    wdot_words,
    wfbroadcast,
    wfload,
    wfloat,
    wfma,
    wfmul,
    wfstore,
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
    wtop_bits,
    wzero,
)
from worker.engine.weights.interleaved_k_blocks import TILE_ROWS, VECTOR_BYTES
from worker.engine.weights.quant_blocks import QK_K


@njit(inline="always", cache=KERNEL_CACHE)
def carry(chains, slot, t, dx):  # pragma: no cover (compiled)
    """chains[slot] = fma(t, dx, chains[slot]) (sixteen lanes)."""
    wfstore(chains, slot * TILE_ROWS, wfma(t, wfbroadcast(dx), wfload(chains, slot * TILE_ROWS)))


@njit(inline="always", cache=KERNEL_CACHE)
def _q4k_quarter_packed(flat_low, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0,
                        m0):  # pragma: no cover (compiled)
    """interleaved_k_matmul' _q45k_quarter's I and M for one x row of Q4_K, straight from the file's packed
    bytes (no unpacking into a scratch: a decode step meets each code once). Packed vector 8h + c holds columns 4c'
    of blocks 2h (low nibbles) and 2h + 1 (high nibbles), c' = c % 8, in the half t = c // 4 of 16 columns; the
    integers are the same sums."""
    s00, s01, s10, s11 = wzero(), wzero(), wzero(), wzero()  # (16,) int32 each: block 2h + b, half t
    base = a0 + 64 * h
    for c in range(4):
        packed = wload_codes(flat_low, (table * 32 + 8 * h + c) * VECTOR_BYTES)  # (64,)
        s00 = wdot4(s00, wlow4(packed), wquad_splat(flat_q, base + 4 * c))  # (16,)
        s10 = wdot4(s10, whigh4(packed), wquad_splat(flat_q, base + 32 + 4 * c))  # (16,)
    for c in range(4, 8):
        packed = wload_codes(flat_low, (table * 32 + 8 * h + c) * VECTOR_BYTES)  # (64,)
        s01 = wdot4(s01, wlow4(packed), wquad_splat(flat_q, base + 4 * c))  # (16,)
        s11 = wdot4(s11, whigh4(packed), wquad_splat(flat_q, base + 32 + 4 * c))  # (16,)
    first = wload_widened(flat_scales, (table * 8 + 2 * h) * TILE_ROWS)  # (16,) block 2h's sub-scale of each row
    second = wload_widened(flat_scales, (table * 8 + 2 * h + 1) * TILE_ROWS)  # (16,)
    i0 = wdot_words(wdot_words(wdot_words(wdot_words(wzero(), s00, first), s01, first), s10, second), s11, second)
    mins = wload_word_pairs(flat_mins, (table * 4 + h) * 2 * TILE_ROWS)  # (16,) the quarter's two mins of each row
    n0 = wmadd_words(mins, wpair_splat(flat_sums, m0 + 2 * h))  # (16,) int32: M
    return i0, n0


@njit(inline="always", cache=KERNEL_CACHE)
def q4k_super_single(flat_low, flat_scales, flat_mins, flat_d, flat_dmin, table, flat_q, flat_sums, dx, s, cols,
                      k0, chains):  # pragma: no cover (compiled)
    """interleaved_k_matmul' _super for one x row of Q4_K, from the packed bytes (_q4k_quarter_packed): the same
    integers, the same float chain."""
    d = wload_scales(flat_d, table * TILE_ROWS)  # (16,)
    negative = wfmul(wload_scales(flat_dmin, table * TILE_ROWS), wfbroadcast(np.float32(-1.0)))  # (16,)
    a0, m0 = k0 * cols + s * QK_K, k0 * (cols // 32) + 8 * s
    for h in range(4):
        i0, n0 = _q4k_quarter_packed(flat_low, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0, m0)
        carry(chains, 0, wfma(wfloat(n0), negative, wfmul(wfloat(i0), d)), dx[k0, 4 * s + h])


@njit(inline="always", cache=KERNEL_CACHE)
def _q4k_quarter_packed4(flat_low, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0, a1, a2, a3, m0, m1, m2,
                         m3):  # pragma: no cover (compiled)
    """_q4k_quarter_packed for four x rows at once: each packed vector's nibbles are split once and met by the four
    rows (no scratch: a step of two to four rows meets each code at most four times); the same integers per row."""
    p00, p01, p10, p11 = wzero(), wzero(), wzero(), wzero()  # (16,) int32 each: x row 0, block 2h + b, half t
    q00, q01, q10, q11 = wzero(), wzero(), wzero(), wzero()  # x row 1
    r00, r01, r10, r11 = wzero(), wzero(), wzero(), wzero()  # x row 2
    u00, u01, u10, u11 = wzero(), wzero(), wzero(), wzero()  # x row 3
    b0, b1, b2, b3 = a0 + 64 * h, a1 + 64 * h, a2 + 64 * h, a3 + 64 * h
    for c in range(4):
        packed = wload_codes(flat_low, (table * 32 + 8 * h + c) * VECTOR_BYTES)  # (64,)
        low, high = wlow4(packed), whigh4(packed)  # (64,) each
        p00 = wdot4(p00, low, wquad_splat(flat_q, b0 + 4 * c))  # (16,)
        p10 = wdot4(p10, high, wquad_splat(flat_q, b0 + 32 + 4 * c))
        q00 = wdot4(q00, low, wquad_splat(flat_q, b1 + 4 * c))
        q10 = wdot4(q10, high, wquad_splat(flat_q, b1 + 32 + 4 * c))
        r00 = wdot4(r00, low, wquad_splat(flat_q, b2 + 4 * c))
        r10 = wdot4(r10, high, wquad_splat(flat_q, b2 + 32 + 4 * c))
        u00 = wdot4(u00, low, wquad_splat(flat_q, b3 + 4 * c))
        u10 = wdot4(u10, high, wquad_splat(flat_q, b3 + 32 + 4 * c))
    for c in range(4, 8):
        packed = wload_codes(flat_low, (table * 32 + 8 * h + c) * VECTOR_BYTES)  # (64,)
        low, high = wlow4(packed), whigh4(packed)  # (64,) each
        p01 = wdot4(p01, low, wquad_splat(flat_q, b0 + 4 * c))  # (16,)
        p11 = wdot4(p11, high, wquad_splat(flat_q, b0 + 32 + 4 * c))
        q01 = wdot4(q01, low, wquad_splat(flat_q, b1 + 4 * c))
        q11 = wdot4(q11, high, wquad_splat(flat_q, b1 + 32 + 4 * c))
        r01 = wdot4(r01, low, wquad_splat(flat_q, b2 + 4 * c))
        r11 = wdot4(r11, high, wquad_splat(flat_q, b2 + 32 + 4 * c))
        u01 = wdot4(u01, low, wquad_splat(flat_q, b3 + 4 * c))
        u11 = wdot4(u11, high, wquad_splat(flat_q, b3 + 32 + 4 * c))
    first = wload_widened(flat_scales, (table * 8 + 2 * h) * TILE_ROWS)  # (16,) block 2h's sub-scale of each row
    second = wload_widened(flat_scales, (table * 8 + 2 * h + 1) * TILE_ROWS)  # (16,)
    i0 = wdot_words(wdot_words(wdot_words(wdot_words(wzero(), p00, first), p01, first), p10, second), p11, second)
    i1 = wdot_words(wdot_words(wdot_words(wdot_words(wzero(), q00, first), q01, first), q10, second), q11, second)
    i2 = wdot_words(wdot_words(wdot_words(wdot_words(wzero(), r00, first), r01, first), r10, second), r11, second)
    i3 = wdot_words(wdot_words(wdot_words(wdot_words(wzero(), u00, first), u01, first), u10, second), u11, second)
    mins = wload_word_pairs(flat_mins, (table * 4 + h) * 2 * TILE_ROWS)  # (16,) the quarter's two mins of each row
    n0 = wmadd_words(mins, wpair_splat(flat_sums, m0 + 2 * h))  # (16,) int32: M of x row 0
    n1 = wmadd_words(mins, wpair_splat(flat_sums, m1 + 2 * h))
    n2 = wmadd_words(mins, wpair_splat(flat_sums, m2 + 2 * h))
    n3 = wmadd_words(mins, wpair_splat(flat_sums, m3 + 2 * h))
    return i0, i1, i2, i3, n0, n1, n2, n3  # (16,) int32 each


@njit(inline="always", cache=KERNEL_CACHE)
def q4k_super_few(flat_low, flat_scales, flat_mins, flat_d, flat_dmin, table, flat_q, flat_sums, dx, s, cols, x0, n,
                  chains):  # pragma: no cover (compiled)
    """interleaved_k_matmul' _super for two to four x rows of Q4_K, from the packed bytes (_q4k_quarter_packed4;
    fewer than four repeat the last row into spare chains, as _super's short tile does): the same integers, the
    same float chains."""
    d = wload_scales(flat_d, table * TILE_ROWS)  # (16,)
    negative = wfmul(wload_scales(flat_dmin, table * TILE_ROWS), wfbroadcast(np.float32(-1.0)))  # (16,)
    k0, k1, k2, k3 = x0, x0 + min(1, n - 1), x0 + min(2, n - 1), x0 + min(3, n - 1)
    a0, a1, a2, a3 = k0 * cols + s * QK_K, k1 * cols + s * QK_K, k2 * cols + s * QK_K, k3 * cols + s * QK_K
    m = cols // 32
    for h in range(4):
        i0, i1, i2, i3, n0, n1, n2, n3 = _q4k_quarter_packed4(
            flat_low, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0, a1, a2, a3, k0 * m + 8 * s,
            k1 * m + 8 * s, k2 * m + 8 * s, k3 * m + 8 * s)
        column = 4 * s + h
        carry(chains, 0, wfma(wfloat(n0), negative, wfmul(wfloat(i0), d)), dx[k0, column])
        carry(chains, 1, wfma(wfloat(n1), negative, wfmul(wfloat(i1), d)), dx[k1, column])
        carry(chains, 2, wfma(wfloat(n2), negative, wfmul(wfloat(i2), d)), dx[k2, column])
        carry(chains, 3, wfma(wfloat(n3), negative, wfmul(wfloat(i3), d)), dx[k3, column])


@njit(inline="always", cache=KERNEL_CACHE)
def _q6k_quarter_packed(flat_low, flat_high, flat_scales, table, h, flat_q, flat_offsets, a0,
                        o0):  # pragma: no cover (compiled)
    """interleaved_k_matmul' _q6k_quarter's I for one x row, straight from the file's packed bytes: quarter h's
    blocks 2h + b are the low (h even) or high (h odd) nibbles of packed vectors 8qq + c, qq = 2 (h // 2) + b, with
    their top two bits joined from the high plane as interleaved_k_matmul' _unpack joins them; group g = 2 blk +
    c // 4 of 16 columns, run e = c % 4 // 2 of 8. Each run's sum starts from -32 S8 as in _q6k_quarter: the same
    integers."""
    i0 = wzero()  # (16,) int32
    for b in range(2):
        qq = 2 * (h // 2) + b  # the packed quarter holding block 2h + b
        low_block = 4 * (qq // 2) + qq % 2  # the block its low nibbles hold (_unpack's `first`)
        block = low_block if h % 2 == 0 else low_block + 2  # = 2h + b
        for g2 in range(2):  # group 2 block + g2: columns 16 g2 .. 16 g2 + 15 of the block
            g = 2 * block + g2
            sub = wlow_words(wload_widened(flat_scales, (table * 16 + g) * TILE_ROWS))  # (16,) group g's sub-scale
            for e in range(2):
                v = wsplat_at(flat_offsets, o0 + 2 * g + e)  # (16,) -32 S8 of the run
                for c in range(4 * g2 + 2 * e, 4 * g2 + 2 * e + 2):
                    packed = wload_codes(flat_low, (table * 32 + 8 * qq + c) * VECTOR_BYTES)  # (64,)
                    top = wload_codes(flat_high, (table * 16 + 8 * (low_block // 4) + c) * VECTOR_BYTES)  # (64,)
                    nibbles = wlow4(packed) if h % 2 == 0 else whigh4(packed)  # (64,)
                    code = wtop_bits(nibbles, top, 2 * (block % 4), 3)  # (64,) six-bit codes
                    v = wdot4(v, code, wquad_splat(flat_q, a0 + 32 * block + 4 * c))  # (16,)
                i0 = wdot_words(i0, v, sub)
    return i0


@njit(inline="always", cache=KERNEL_CACHE)
def q6k_super_single(flat_low, flat_high, flat_scales, flat_d, table, flat_q, flat_offsets, dx, s, cols, k0,
                      chains):  # pragma: no cover (compiled)
    """interleaved_k_matmul' _super for one x row of Q6_K, from the packed bytes (_q6k_quarter_packed): the same
    integers, the same float chain."""
    d = wload_scales(flat_d, table * TILE_ROWS)  # (16,)
    a0, o0 = k0 * cols + s * QK_K, k0 * (cols // 8) + 32 * s
    for h in range(4):
        i0 = _q6k_quarter_packed(flat_low, flat_high, flat_scales, table, h, flat_q, flat_offsets, a0, o0)
        carry(chains, 0, wfmul(wfloat(i0), d), dx[k0, 4 * s + h])


@njit(inline="always", cache=KERNEL_CACHE)
def _q6k_quarter_packed4(flat_low, flat_high, flat_scales, table, h, flat_q, flat_offsets, a0, a1, a2, a3, o0, o1, o2,
                         o3):  # pragma: no cover (compiled)
    """_q6k_quarter_packed for four x rows at once: each six-bit code vector is joined once and met by the four
    rows; the same integers per row."""
    i0, i1, i2, i3 = wzero(), wzero(), wzero(), wzero()  # (16,) int32 each
    for b in range(2):
        qq = 2 * (h // 2) + b  # the packed quarter holding block 2h + b
        low_block = 4 * (qq // 2) + qq % 2  # the block its low nibbles hold (_unpack's `first`)
        block = low_block if h % 2 == 0 else low_block + 2  # = 2h + b
        for g2 in range(2):  # group 2 block + g2: columns 16 g2 .. 16 g2 + 15 of the block
            g = 2 * block + g2
            sub = wlow_words(wload_widened(flat_scales, (table * 16 + g) * TILE_ROWS))  # (16,) group g's sub-scale
            for e in range(2):
                v0 = wsplat_at(flat_offsets, o0 + 2 * g + e)  # (16,) -32 S8 of the run, x row 0
                v1 = wsplat_at(flat_offsets, o1 + 2 * g + e)
                v2 = wsplat_at(flat_offsets, o2 + 2 * g + e)
                v3 = wsplat_at(flat_offsets, o3 + 2 * g + e)
                for c in range(4 * g2 + 2 * e, 4 * g2 + 2 * e + 2):
                    packed = wload_codes(flat_low, (table * 32 + 8 * qq + c) * VECTOR_BYTES)  # (64,)
                    top = wload_codes(flat_high, (table * 16 + 8 * (low_block // 4) + c) * VECTOR_BYTES)  # (64,)
                    nibbles = wlow4(packed) if h % 2 == 0 else whigh4(packed)  # (64,)
                    code = wtop_bits(nibbles, top, 2 * (block % 4), 3)  # (64,) six-bit codes
                    column = 32 * block + 4 * c
                    v0 = wdot4(v0, code, wquad_splat(flat_q, a0 + column))  # (16,)
                    v1 = wdot4(v1, code, wquad_splat(flat_q, a1 + column))
                    v2 = wdot4(v2, code, wquad_splat(flat_q, a2 + column))
                    v3 = wdot4(v3, code, wquad_splat(flat_q, a3 + column))
                i0, i1 = wdot_words(i0, v0, sub), wdot_words(i1, v1, sub)
                i2, i3 = wdot_words(i2, v2, sub), wdot_words(i3, v3, sub)
    return i0, i1, i2, i3


@njit(inline="always", cache=KERNEL_CACHE)
def q6k_super_few(flat_low, flat_high, flat_scales, flat_d, table, flat_q, flat_offsets, dx, s, cols, x0, n,
                  chains):  # pragma: no cover (compiled)
    """interleaved_k_matmul' _super for two to four x rows of Q6_K, from the packed bytes (_q6k_quarter_packed4;
    fewer than four repeat the last row into spare chains): the same integers, the same float chains."""
    d = wload_scales(flat_d, table * TILE_ROWS)  # (16,)
    k0, k1, k2, k3 = x0, x0 + min(1, n - 1), x0 + min(2, n - 1), x0 + min(3, n - 1)
    a0, a1, a2, a3 = k0 * cols + s * QK_K, k1 * cols + s * QK_K, k2 * cols + s * QK_K, k3 * cols + s * QK_K
    o = cols // 8
    for h in range(4):
        i0, i1, i2, i3 = _q6k_quarter_packed4(flat_low, flat_high, flat_scales, table, h, flat_q, flat_offsets, a0,
                                              a1, a2, a3, k0 * o + 32 * s, k1 * o + 32 * s, k2 * o + 32 * s,
                                              k3 * o + 32 * s)
        column = 4 * s + h
        carry(chains, 0, wfmul(wfloat(i0), d), dx[k0, column])
        carry(chains, 1, wfmul(wfloat(i1), d), dx[k1, column])
        carry(chains, 2, wfmul(wfloat(i2), d), dx[k2, column])
        carry(chains, 3, wfmul(wfloat(i3), d), dx[k3, column])
