"""Wide tiles for the integer matmuls on AVX-512 VNNI: a task's sixteen weight rows side by side in every 512-bit
vector (simd_wide.py), so one `vpdpbusd` multiplies four codes of each of the sixteen rows into one x row's four
activations and sums them in that row's int32 lane.

The arithmetic is int_kernels.py's REDUCTION, term for term, as int_tiles.py's eight-row tiles are: the same
integer sums w[h] and w[4 + h] (integers are exact in any order), the same float32 products d * dx, the same fused
multiply-adds in the same order per chain and the same final sums; sixteen lanes instead of eight change no lane's
arithmetic. So a result is bit-identical to the other paths', and a step may take any of them.

Per x row and 16 columns of a block: four `vpdpbusd` sum 16 products per row, then the block's sub-scale is applied
in integers. Q4_K: one `vpdpwssd` (the sum is below 16 * 15 * 127 < 32768, so its low int16 times the sub-scale is
exact); Q5_K: one `vpdpwssd` per two `vpdpbusd` (8 * 31 * 127 < 32768); Q6_K: one `vpmulld` (its int8 sub-scales
are signed and its sums up to 16 * 63 * 127). The unpacking is int_tiles.py's, with the two tiles' vectors laid side
by side (codes 64 bytes apart; sub-scales as int32 lanes); Q4_K's and Q6_K's codes are transposed for all sixteen
rows at once with 512-bit shuffles (wide_unpack.unpack_nibbles16, unpack_q6_16: 7-19% faster at 4 to 64 rows than
two eight-row passes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from worker.engine.int_tiles import (
    CHAINS,
    CHAINS6,
    CODES_BYTES,
    RAW_BYTES,
    TILE_ROWS,
    prefetch_task,
    unpack_codes45,
)
from worker.engine.quant_blocks import QK_K
from worker.engine.simd_int import KERNEL_CACHE
from worker.engine.simd_rows import transpose_mins, transpose_offsets
from worker.engine.simd_wide import (
    WIDE_ROWS,
    wadd,
    wdot4,
    wdot_words,
    wfadd,
    wfbroadcast,
    wfload,
    wfloat,
    wfma,
    wfmul,
    wfstore,
    wfzero,
    wload_codes,
    wload_ints,
    wmadd_words,
    wmul,
    wpair_splat,
    wquad_splat,
    wrow_floats,
    wsub,
    wzero,
)
from worker.engine.wide_unpack import transpose_scales32, unpack_nibbles16, unpack_q6_16

SPACING = 2 * 32  # bytes between a wide tile's code vectors (two eight-row tiles' side by side)
X_ROWS = 32  # x rows a task carries over a super-block (their chains, 33 * 12 * 16 float32, stay in L1)


@njit(inline="always", cache=KERNEL_CACHE)
def _sums45(codes, scales32, flat_q, qa0, qa1, h, half, fifth):  # pragma: no cover (compiled)
    """w[4 * half + h] (int32x16 over the rows) for two x rows (activations from qa0 and qa1): blocks 2h and 2h+1,
    columns 16*half..16*half+15 of each, times their sub-scales. `fifth` (a constant): Q5_K's codes, below 32, take
    one vpdpwssd per two vpdpbusd; Q4_K's, below 16, one per four."""
    t0, t1 = wzero(), wzero()  # (16,) int32 each: the two x rows' sums
    for b in range(2):
        j = 2 * h + b
        at = (8 * j + 4 * half) * SPACING
        x0, x1 = qa0 + 32 * j + 16 * half, qa1 + 32 * j + 16 * half
        sub = wload_ints(scales32, WIDE_ROWS * j)  # (16,) block j's sub-scale of each row
        v0, v1 = wzero(), wzero()  # (16,) int32 each: products not yet scaled
        for c in range(4):
            code = wload_codes(codes, at + SPACING * c)  # (64,) 16 rows x 4 codes
            v0 = wdot4(v0, code, wquad_splat(flat_q, x0 + 4 * c))  # (16,)
            v1 = wdot4(v1, code, wquad_splat(flat_q, x1 + 4 * c))  # (16,)
            if fifth and c % 2 == 1 or c == 3:
                t0, t1 = wdot_words(t0, v0, sub), wdot_words(t1, v1, sub)  # (16,) each
                v0, v1 = wzero(), wzero()  # (16,) each
    return t0, t1


@njit(inline="always", cache=KERNEL_CACHE)
def _carry(chains, at, w, factor):  # pragma: no cover (compiled)
    """chains[at..at+15] = fma(float(w), factor, chains[at..at+15])."""
    wfstore(chains, at, wfma(wfloat(w), factor, wfload(chains, at)))


@njit(inline="always", cache=KERNEL_CACHE)
def _q45k_pass(codes, scales32, mins_words, d, dmin, r0, s, flat_q, flat_dx8, flat_sums, cols, first, n, chains,
               fifth):  # pragma: no cover (compiled)
    """Carry the chains of rows r0..r0+15 and x rows first..first+n-1 over super-block s (unpacked into codes,
    scales32 and mins_words): chains[(i * CHAINS + l) * 16 ..] is chain l of x row first+i (slot n a spare: x rows go
    two at a time, an odd last one twice)."""
    supers = cols // QK_K
    scale = wrow_floats(d.reshape(-1), r0 * supers + s, supers)  # (16,) d of each row
    negative = wfmul(wrow_floats(dmin.reshape(-1), r0 * supers + s, supers), wfbroadcast(np.float32(-1.0)))  # (16,)
    for i in range(0, n, 2):
        k0, k1 = first + i, first + min(i + 1, n - 1)
        at0, at1 = i * CHAINS * WIDE_ROWS, (i + 1) * CHAINS * WIDE_ROWS
        for h in range(4):
            dx0 = wfbroadcast(flat_dx8[(k0 * supers + s) * 8 + h])  # (16,)
            dx1 = wfbroadcast(flat_dx8[(k1 * supers + s) * 8 + h])  # (16,)
            for half in range(2):
                w0, w1 = _sums45(codes, scales32, flat_q, k0 * cols + s * QK_K, k1 * cols + s * QK_K, h, half,
                                 fifth)  # (16,) int32 each
                lane = (4 * half + h) * WIDE_ROWS
                _carry(chains, at0 + lane, w0, wfmul(scale, dx0))  # d * dx, as the other paths round it
                _carry(chains, at1 + lane, w1, wfmul(scale, dx1))
            mins = wload_ints(mins_words, 2 * WIDE_ROWS * h)  # (16,) quarter h's two mins of each row
            sums0 = wpair_splat(flat_sums, k0 * (cols // 32) + 8 * s + 2 * h)  # (16,) two int16 sums
            sums1 = wpair_splat(flat_sums, k1 * (cols // 32) + 8 * s + 2 * h)  # (16,)
            lane = (8 + h) * WIDE_ROWS
            _carry(chains, at0 + lane, wmadd_words(mins, sums0), wfmul(negative, dx0))
            _carry(chains, at1 + lane, wmadd_words(mins, sums1), wfmul(negative, dx1))


@njit(inline="always", cache=KERNEL_CACHE)
def _finish(chains, n, out_flat, first, rows_total, r0, per_row, mins):  # pragma: no cover (compiled)
    """out[k, r0..r0+15] for x rows first..first+n-1, as int_tiles.finish_tile sums its chains."""
    zero = wfzero()
    for i in range(n):
        at = i * per_row * WIDE_ROWS
        a0, a1 = wfload(chains, at), wfload(chains, at + 16)  # (16,) each
        a2, a3 = wfload(chains, at + 32), wfload(chains, at + 48)
        a4, a5 = wfload(chains, at + 64), wfload(chains, at + 80)
        a6, a7 = wfload(chains, at + 96), wfload(chains, at + 112)
        total = wfadd(wfadd(wfadd(a0, a4), wfadd(a2, a6)), wfadd(wfadd(a1, a5), wfadd(a3, a7)))  # (16,)
        if mins:
            m0, m1 = wfload(chains, at + 128), wfload(chains, at + 144)
            m2, m3 = wfload(chains, at + 160), wfload(chains, at + 176)
            total = wfadd(total, wfadd(wfadd(wfadd(m0, zero), wfadd(m2, zero)), wfadd(wfadd(m1, zero), wfadd(m3, zero))))
        wfstore(out_flat, (first + i) * rows_total + r0, total)


@njit(inline="always", cache=KERNEL_CACHE)
def wide_q45k_task(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums, flat_out, half,
                   low, first, last):  # pragma: no cover (compiled)
    """out[k, low..low+15] for x rows first..last-1 of a Q4_K (or Q5_K) matrix: int_kernels._q4k's task, wide."""
    rows, supers = d.shape
    sub = half // 16  # sub-scales (and mins) per row
    flat_scales = scales.reshape(-1)
    codes = np.empty(2 * CODES_BYTES, np.uint8)  # (4096,) a super-block of sixteen rows, unpacked
    scales32 = np.empty(8 * WIDE_ROWS, np.int32)  # (128,) its sub-scales
    mins_words = np.empty(4 * 2 * WIDE_ROWS, np.int16)  # (128,) its mins, in pairs
    raw = np.empty(RAW_BYTES, np.uint8)  # (1280,) packed bytes, transposed
    chains = np.empty((X_ROWS + 1) * CHAINS * WIDE_ROWS, np.float32)  # (33*12*16,)
    for x0 in range(first, last, X_ROWS):
        n = min(X_ROWS, last - x0)
        chains[:] = 0
        for s in range(supers):
            if x0 == first:  # later passes find the codes in L2
                prefetch_task(flat_codes, low, s, supers, half, rows)
            if not flat_fifth.size:  # Q4_K: all sixteen rows' codes in one pass of 512-bit shuffles
                unpack_nibbles16(flat_codes, low * half + s * (QK_K // 2), half, codes, 0)
            for t in range(2):
                r = low + TILE_ROWS * t
                if flat_fifth.size:
                    unpack_codes45(flat_codes, flat_fifth, r, s, half, raw, codes[32 * t:], SPACING)
                transpose_scales32(flat_scales, r * sub + 8 * s, sub, scales32, TILE_ROWS * t, WIDE_ROWS)
                transpose_mins(flat_mins, r * sub + 8 * s, sub, mins_words, 16 * t, 2 * WIDE_ROWS)
            if flat_fifth.size:
                _q45k_pass(codes, scales32, mins_words, d, dmin, low, s, flat_q, flat_dx8, flat_sums, 2 * half, x0, n,
                           chains, True)
            else:
                _q45k_pass(codes, scales32, mins_words, d, dmin, low, s, flat_q, flat_dx8, flat_sums, 2 * half, x0, n,
                           chains, False)
        _finish(chains, n, flat_out, x0, rows, low, CHAINS, True)


@njit(inline="always", cache=KERNEL_CACHE)
def _sums6(codes, scales32, flat_q, qa0, qa1, h, half):  # pragma: no cover (compiled)
    """Q6_K's w[4 * half + h] before the -32, for two x rows: groups 4h + half and 4h + 2 + half (one vpmulld each:
    16 products of codes up to 63 exceed int16)."""
    t0, t1 = wzero(), wzero()  # (16,) int32 each
    for b in range(2):
        j = 2 * h + b
        at = (8 * j + 4 * half) * SPACING
        x0, x1 = qa0 + 32 * j + 16 * half, qa1 + 32 * j + 16 * half
        sub = wload_ints(scales32, WIDE_ROWS * (2 * j + half))  # (16,) the group's signed sub-scale of each row
        v0, v1 = wzero(), wzero()  # (16,) int32 each
        for c in range(4):
            code = wload_codes(codes, at + SPACING * c)  # (64,)
            v0 = wdot4(v0, code, wquad_splat(flat_q, x0 + 4 * c))  # (16,)
            v1 = wdot4(v1, code, wquad_splat(flat_q, x1 + 4 * c))  # (16,)
        t0, t1 = wadd(t0, wmul(v0, sub)), wadd(t1, wmul(v1, sub))  # (16,) each
    return t0, t1


@njit(inline="always", cache=KERNEL_CACHE)
def _q6k_pass(codes, scales32, offsets, d, r0, s, flat_q, flat_dx8, flat_sums, cols, first, n,
              chains):  # pragma: no cover (compiled)
    """Carry the Q6_K chains of rows r0..r0+15 and x rows first..first+n-1 over super-block s, as _q45k_pass."""
    supers = cols // QK_K
    scale = wrow_floats(d.reshape(-1), r0 * supers + s, supers)  # (16,)
    for i in range(0, n, 2):
        k0, k1 = first + i, first + min(i + 1, n - 1)
        at0, at1 = i * CHAINS6 * WIDE_ROWS, (i + 1) * CHAINS6 * WIDE_ROWS
        for h in range(4):
            dx0 = wfbroadcast(flat_dx8[(k0 * supers + s) * 8 + h])  # (16,)
            dx1 = wfbroadcast(flat_dx8[(k1 * supers + s) * 8 + h])  # (16,)
            for half in range(2):
                w0, w1 = _sums6(codes, scales32, flat_q, k0 * cols + s * QK_K, k1 * cols + s * QK_K, h,
                                half)  # (16,) int32 each
                sums = k0 * (cols // 16) + 16 * s + 4 * h + 2 * half  # groups 4h + half and 4h + 2 + half, paired
                paired = wload_ints(offsets, 2 * WIDE_ROWS * (2 * h + half))  # (16,) 32 * the two sub-scales
                sums0 = wpair_splat(flat_sums, sums)  # (16,)
                sums1 = wpair_splat(flat_sums, sums + (k1 - k0) * (cols // 16))  # (16,)
                lane = (4 * half + h) * WIDE_ROWS
                _carry(chains, at0 + lane, wsub(w0, wmadd_words(paired, sums0)), wfmul(scale, dx0))
                _carry(chains, at1 + lane, wsub(w1, wmadd_words(paired, sums1)), wfmul(scale, dx1))


@njit(inline="always", cache=KERNEL_CACHE)
def wide_q6k_task(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, flat_out, half, low, first,
                  last):  # pragma: no cover (compiled)
    """out[k, low..low+15] for x rows first..last-1 of a Q6_K matrix: int_kernels._q6k's task, wide."""
    rows, supers = d.shape
    groups = half // 8  # sub-scales per row
    codes = np.empty(2 * CODES_BYTES, np.uint8)  # (4096,)
    scales32 = np.empty(16 * WIDE_ROWS, np.int32)  # (256,) sixteen groups' sub-scales
    offsets = np.empty(8 * 2 * WIDE_ROWS, np.int16)  # (256,) the paired offsets
    chains = np.empty((X_ROWS + 1) * CHAINS6 * WIDE_ROWS, np.float32)  # (33*8*16,)
    for x0 in range(first, last, X_ROWS):
        n = min(X_ROWS, last - x0)
        chains[:] = 0
        for s in range(supers):
            if x0 == first:
                prefetch_task(flat_low, low, s, supers, half, rows)
            unpack_q6_16(flat_low, low * half + s * (QK_K // 2), half, flat_high, low * (half // 2) + s * (QK_K // 4),
                         half // 2, codes, 0)
            for t in range(2):
                r = low + TILE_ROWS * t
                at = r * groups + 16 * s
                transpose_scales32(flat_scales, at, groups, scales32, TILE_ROWS * t, WIDE_ROWS)  # groups 0..7
                transpose_scales32(flat_scales, at + 8, groups, scales32, 8 * WIDE_ROWS + TILE_ROWS * t, WIDE_ROWS)
                transpose_offsets(flat_scales, at, groups, offsets, 16 * t, 2 * WIDE_ROWS)
            _q6k_pass(codes, scales32, offsets, d, low, s, flat_q, flat_dx8, flat_sums, 2 * half, x0, n, chains)
        _finish(chains, n, flat_out, x0, rows, low, CHAINS6, False)
