"""Interleaved tiles for the wider steps of the integer matmuls: eight weight rows at once, their codes side by side
in every vector (simd_rows.py), so each product of codes and one x row's activations lands in its own row's lane.

The arithmetic is int_kernels.py's REDUCTION, term for term: the same integer sums w[h] and w[4 + h] per weight
row, x row and super-block (integers are exact in any order), the same float32 products d * dx, the same fused
multiply-adds in the same order per chain, and the same final sums. So a result is bit-identical to the row-major
loops', and a step may take either path. What changes is the work per super-block and x row: the four columns of a
vpmaddubsw now belong to one row, so up to four of them are summed in int16 before a single vpmaddwd applies their
block's sub-scale, and nothing is summed across lanes (no vphaddd). Per row and super-block that is 8 + 2.5
multiplies instead of 17.

A super-block of the tile's eight rows is unpacked once (2 KiB of codes in L1, interleaved as rows r, columns
4c..4c+3) and met by every x row of the step's tile.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from worker.engine.quant_blocks import QK_K
from worker.engine.simd import LANES, vadd, vbroadcast, vfma, vload, vmul, vstore, vzero
from worker.engine.simd_int import KERNEL_CACHE, iadd, ifloat
from worker.engine.simd_rows import (
    add16,
    high4,
    izero,
    load_octets,
    load_words,
    low4,
    octets_zero,
    pair_splat,
    pair_sums,
    quad_splat,
    row_floats,
    scaled_pairs,
    store_octets,
    transpose_mins,
    transpose_rows,
    transpose_scales,
    with_bit,
    words_zero,
)

TILE_ROWS = 8  # weight rows interleaved in a tile (eight int32 lanes)
RAW_BYTES = 5 * 256  # the packed bytes of a tile's super-block, transposed (codes, then Q5_K's fifth bits)
CODES_BYTES = 8 * 8 * 32  # a tile's unpacked super-block: block j, column group c -> 32 bytes (8 rows x 4 codes)
WORDS = 12 * 16  # its eight sub-scale vectors, then its four mins vectors (int16x16 each)
CHAINS = 12  # float32x8 chains per tile and x row: eight for w (lane 4 * half + h), four for the mins (quarter h)


@njit(inline="always", cache=KERNEL_CACHE)
def unpack_q45k(flat_codes, flat_fifth, scales, flat_mins, r0, s, half, raw, codes_out, words_out):  # pragma: no cover
    """Super-block s of Q4_K (or, with fifth bits, Q5_K) rows r0..r0+7, interleaved: codes_out[(8j + c) * 32 + 4r + e]
    is the code of row r0+r, block j, column 4c+e; words_out holds block j's sub-scale of each row (vector j) and
    quarter h's two mins of each row (vector 8 + h). raw (1280,) is scratch for the packed bytes."""
    cols = 2 * half
    sub = cols // 32  # sub-scales (and mins) per row
    for t in range(4):  # packed bytes 32t..32t+31: blocks 2t (low nibbles) and 2t+1 (high)
        transpose_rows(flat_codes, r0 * half + s * (QK_K // 2) + 32 * t, half, raw, 256 * t)
    if flat_fifth.size:
        transpose_rows(flat_fifth, r0 * (half // 4) + s * (QK_K // 8), half // 4, raw, 1024)
    for c in range(8):
        fifth = load_octets(raw, 1024 + 32 * c) if flat_fifth.size else octets_zero()  # (32,)
        for t in range(4):
            packed = load_octets(raw, 256 * t + 32 * c)  # (32,) 8 rows x 4 bytes
            low, high = low4(packed), high4(packed)
            if flat_fifth.size:
                low, high = with_bit(low, fifth, 2 * t), with_bit(high, fifth, 2 * t + 1)
            store_octets(codes_out, (8 * (2 * t) + c) * 32, low)
            store_octets(codes_out, (8 * (2 * t + 1) + c) * 32, high)
    transpose_scales(scales.reshape(-1), r0 * sub + 8 * s, sub, words_out, 0)
    transpose_mins(flat_mins, r0 * sub + 8 * s, sub, words_out, 128)


@njit(inline="always", cache=KERNEL_CACHE)
def _half_sums(codes, words, flat_q, qa0, qa1, h, half):  # pragma: no cover (compiled)
    """w[4 * half + h] (int32x8 over the rows) of both tiles (codes and words hold two: rows r0.. and r0+8..) and
    two x rows (activations from qa0 and qa1): blocks 2h and 2h+1, columns 16*half..16*half+15 of each, scaled by
    their sub-scales. Each code vector is loaded once for both x rows, each activation splat once for both tiles."""
    t00, t01, t10, t11 = izero(), izero(), izero(), izero()  # (tile, x row)
    for b in range(2):
        j = 2 * h + b
        at = (8 * j + 4 * half) * 32
        x0, x1 = qa0 + 32 * j + 16 * half, qa1 + 32 * j + 16 * half
        a00, a01, a10, a11 = words_zero(), words_zero(), words_zero(), words_zero()  # int16: at most 4 * 7874
        for c in range(4):
            c0, c1 = load_octets(codes, at + 32 * c), load_octets(codes, CODES_BYTES + at + 32 * c)
            q0, q1 = quad_splat(flat_q, x0 + 4 * c), quad_splat(flat_q, x1 + 4 * c)
            a00, a01 = add16(a00, pair_sums(c0, q0)), add16(a01, pair_sums(c0, q1))
            a10, a11 = add16(a10, pair_sums(c1, q0)), add16(a11, pair_sums(c1, q1))
        s0, s1 = load_words(words, 16 * j), load_words(words, WORDS + 16 * j)
        t00, t01 = iadd(t00, scaled_pairs(a00, s0)), iadd(t01, scaled_pairs(a01, s0))
        t10, t11 = iadd(t10, scaled_pairs(a10, s1)), iadd(t11, scaled_pairs(a11, s1))
    return t00, t01, t10, t11


@njit(inline="always", cache=KERNEL_CACHE)
def _carry(chains, at, w, factor):  # pragma: no cover (compiled)
    """chains[at..at+7] = fma(float(w), factor, chains[at..at+7])."""
    vstore(chains, at, vfma(ifloat(w), factor, vload(chains, at)))


@njit(inline="always", cache=KERNEL_CACHE)
def q45k_tiles(codes, words, d, dmin, r0, s, flat_q, flat_dx8, flat_sums, cols, first, n, chains,
               tile_stride):  # pragma: no cover (compiled)
    """Carry the chains of two tiles (rows r0..r0+15, unpacked by unpack_q45k into codes and words) and x rows
    first..first+n-1 over super-block s: chains[t * tile_stride + (i * CHAINS + l) * 8 ..] is chain l of tile t and
    x row first+i, for i up to n (slot n is a spare: x rows go two at a time)."""
    supers = cols // QK_K
    flat_d, flat_dmin = d.reshape(-1), dmin.reshape(-1)
    minus = vbroadcast(np.float32(-1.0))
    scale0 = row_floats(flat_d, r0 * supers + s, supers)  # (8,) d of each row
    scale1 = row_floats(flat_d, (r0 + TILE_ROWS) * supers + s, supers)  # (8,)
    negative0 = vmul(row_floats(flat_dmin, r0 * supers + s, supers), minus)  # (8,) -dmin
    negative1 = vmul(row_floats(flat_dmin, (r0 + TILE_ROWS) * supers + s, supers), minus)  # (8,)
    for i in range(0, n, 2):
        k0, k1 = first + i, first + min(i + 1, n - 1)  # an odd last row is computed twice, and kept once:
        at0, at1 = i * CHAINS * LANES, (i + 1) * CHAINS * LANES  # its twin's chains go to the spare slot n
        for h in range(4):
            dx0 = vbroadcast(flat_dx8[(k0 * supers + s) * LANES + h])  # (8,)
            dx1 = vbroadcast(flat_dx8[(k1 * supers + s) * LANES + h])  # (8,)
            for half in range(2):
                w00, w01, w10, w11 = _half_sums(codes, words, flat_q, k0 * cols + s * QK_K, k1 * cols + s * QK_K, h,
                                                half)
                lane = (4 * half + h) * LANES
                _carry(chains, at0 + lane, w00, vmul(scale0, dx0))  # d * dx, as the row-major loops round it
                _carry(chains, tile_stride + at0 + lane, w10, vmul(scale1, dx0))
                _carry(chains, at1 + lane, w01, vmul(scale0, dx1))
                _carry(chains, tile_stride + at1 + lane, w11, vmul(scale1, dx1))
            sums0 = pair_splat(flat_sums, k0 * (cols // 32) + 8 * s + 2 * h)  # (16,) int16
            sums1 = pair_splat(flat_sums, k1 * (cols // 32) + 8 * s + 2 * h)  # (16,)
            mins0, mins1 = load_words(words, 16 * (8 + h)), load_words(words, WORDS + 16 * (8 + h))
            lane = (8 + h) * LANES
            _carry(chains, at0 + lane, scaled_pairs(mins0, sums0), vmul(negative0, dx0))
            _carry(chains, tile_stride + at0 + lane, scaled_pairs(mins1, sums0), vmul(negative1, dx0))
            _carry(chains, at1 + lane, scaled_pairs(mins0, sums1), vmul(negative0, dx1))
            _carry(chains, tile_stride + at1 + lane, scaled_pairs(mins1, sums1), vmul(negative1, dx1))


@njit(inline="always", cache=KERNEL_CACHE)
def finish_tile(chains, base, n, out_flat, first, rows_total, r0):  # pragma: no cover (compiled)
    """out[k, r0..r0+7] for x rows first..first+n-1: vsum of each w chain plus vsum of each mins chain, in
    simd.vsum's order (lanes 4..7 of a mins chain are zeros there)."""
    zero = vzero()
    for i in range(n):
        at = base + i * CHAINS * LANES
        a0, a1, a2, a3 = vload(chains, at), vload(chains, at + 8), vload(chains, at + 16), vload(chains, at + 24)
        a4, a5, a6, a7 = vload(chains, at + 32), vload(chains, at + 40), vload(chains, at + 48), vload(chains, at + 56)
        m0, m1 = vload(chains, at + 64), vload(chains, at + 72)
        m2, m3 = vload(chains, at + 80), vload(chains, at + 88)
        w = vadd(vadd(vadd(a0, a4), vadd(a2, a6)), vadd(vadd(a1, a5), vadd(a3, a7)))
        m = vadd(vadd(vadd(m0, zero), vadd(m2, zero)), vadd(vadd(m1, zero), vadd(m3, zero)))
        vstore(out_flat, (first + i) * rows_total + r0, vadd(w, m))
