"""Interleaved tiles for the wider steps of the integer matmuls: eight weight rows at once, their codes side by side
in every vector (simd_rows.py), so each product of codes and one x row's activations lands in its own row's lane.

The arithmetic is int_kernels.py's REDUCTION, term for term: the same integer sums w[h] and w[4 + h] per weight
row, x row and super-block (integers are exact in any order), the same float32 products d * dx, the same fused
multiply-adds in the same order per chain, and the same final sums. So a result is bit-identical to the row-major
loops', and a step may take either path. What changes is the work per super-block and x row: the four columns of a
vpmaddubsw now belong to one row, so several of them are summed in int16 before one vpmaddwd applies their
sub-scale (four for Q4_K and Q5_K, whose codes are below 32; two for Q6_K's, below 64), and nothing is summed
across lanes (no vphaddd). Per row and super-block that is 10.5 multiplies instead of 17 for Q4_K (13 for Q6_K).

A super-block of two tiles (sixteen rows) is unpacked once per tile of x rows (its packed bytes transposed eight
rows at a time with vector shuffles, then split into codes: 2 KiB a tile in L1) and met by the x rows two at a time,
so each code vector loaded serves two x rows and each activation splat serves two tiles.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from worker.engine.quant_blocks import QK_K
from worker.engine.simd import LANES, vadd, vbroadcast, vfma, vload, vmul, vstore, vzero
from worker.engine.simd_int import KERNEL_CACHE, iadd, ifloat, isub
from worker.engine.simd_rows import (
    add16,
    high4,
    izero,
    load_ints,
    low4,
    octets_zero,
    pair_splat,
    pair_sums,
    prefetch_rows,
    quad_splat,
    row_floats,
    scaled_pairs,
    store_octets,
    transpose_mins,
    transpose_offsets,
    transpose_rows,
    transpose_scales,
    with_bits,
    words_zero,
)

TILE_ROWS = 8  # weight rows interleaved in a tile (eight int32 lanes)
RAW_BYTES = 5 * 256  # the packed bytes of a tile's super-block, transposed (codes, then Q5_K's fifth bits)
CODES_BYTES = 8 * 8 * 32  # a tile's unpacked super-block: block j, column group c -> 32 bytes (8 rows x 4 codes)
WORDS = 12 * 16  # its eight sub-scale vectors, then its four mins vectors (int16x16 each)
CHAINS = 12  # float32x8 chains per tile and x row: eight for w (lane 4 * half + h), four for the mins (quarter h)
RAW6_BYTES = 6 * 256  # Q6_K's packed bytes of a tile's super-block, transposed (low four bits, then bits 4-5)
WORDS6 = 24 * 16  # Q6_K: sixteen group sub-scale vectors, then eight paired offset vectors (int16x16 each)
CHAINS6 = 8  # Q6_K: float32x8 chains per tile and x row (no mins)
X_ROWS = 16  # x rows a task carries over a super-block (their chains, 2 * 17 * 12 * 8 float32, stay in L1)
PREFETCH_AHEAD = 4  # super-blocks ahead whose codes a task asks for


@njit(inline="always", cache=KERNEL_CACHE)
def unpack_codes45(flat_codes, flat_fifth, r0, s, half, raw, codes_out, spacing):  # pragma: no cover (compiled)
    """Super-block s's codes of Q4_K (or, with fifth bits, Q5_K) rows r0..r0+7, interleaved: codes_out[(8j + c) *
    spacing + 4r + e] is the code of row r0+r, block j, column 4c+e (spacing 32, or 64 where two tiles' vectors lie
    side by side). raw (1280,) is scratch for the packed bytes."""
    for t in range(4):  # packed bytes 32t..32t+31: blocks 2t (low nibbles) and 2t+1 (high)
        transpose_rows(flat_codes, r0 * half + s * (QK_K // 2) + 32 * t, half, raw, 256 * t)
    if flat_fifth.size:
        transpose_rows(flat_fifth, r0 * (half // 4) + s * (QK_K // 8), half // 4, raw, 1024)
    for c in range(8):
        fifth = load_ints(raw, 1024 + 32 * c) if flat_fifth.size else octets_zero()  # (32,)
        for t in range(4):
            packed = load_ints(raw, 256 * t + 32 * c)  # (32,) 8 rows x 4 bytes
            low, high = low4(packed), high4(packed)
            if flat_fifth.size:
                low, high = with_bits(low, fifth, 2 * t, 1), with_bits(high, fifth, 2 * t + 1, 1)
            store_octets(codes_out, (8 * (2 * t) + c) * spacing, low)
            store_octets(codes_out, (8 * (2 * t + 1) + c) * spacing, high)


@njit(inline="always", cache=KERNEL_CACHE)
def unpack_q45k(flat_codes, flat_fifth, scales, flat_mins, r0, s, half, raw, codes_out, words_out):  # pragma: no cover
    """Super-block s of Q4_K (or, with fifth bits, Q5_K) rows r0..r0+7: its codes as unpack_codes45 (spacing 32);
    words_out holds block j's sub-scale of each row (vector j) and quarter h's two mins of each row (vector 8 + h)."""
    sub = half // 16  # sub-scales (and mins) per row
    unpack_codes45(flat_codes, flat_fifth, r0, s, half, raw, codes_out, 32)
    transpose_scales(scales.reshape(-1), r0 * sub + 8 * s, sub, words_out, 0)
    transpose_mins(flat_mins, r0 * sub + 8 * s, sub, words_out, 128, 16)


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
            c0, c1 = load_ints(codes, at + 32 * c), load_ints(codes, CODES_BYTES + at + 32 * c)  # (32,) each
            q0, q1 = quad_splat(flat_q, x0 + 4 * c), quad_splat(flat_q, x1 + 4 * c)  # (32,) each
            a00, a01 = add16(a00, pair_sums(c0, q0)), add16(a01, pair_sums(c0, q1))
            a10, a11 = add16(a10, pair_sums(c1, q0)), add16(a11, pair_sums(c1, q1))
        s0, s1 = load_ints(words, 16 * j), load_ints(words, WORDS + 16 * j)  # (16,) each
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
                                                half)  # (8,) int32 each
                lane = (4 * half + h) * LANES
                _carry(chains, at0 + lane, w00, vmul(scale0, dx0))  # d * dx, as the row-major loops round it
                _carry(chains, tile_stride + at0 + lane, w10, vmul(scale1, dx0))
                _carry(chains, at1 + lane, w01, vmul(scale0, dx1))
                _carry(chains, tile_stride + at1 + lane, w11, vmul(scale1, dx1))
            sums0 = pair_splat(flat_sums, k0 * (cols // 32) + 8 * s + 2 * h)  # (16,) int16
            sums1 = pair_splat(flat_sums, k1 * (cols // 32) + 8 * s + 2 * h)  # (16,)
            mins0, mins1 = load_ints(words, 16 * (8 + h)), load_ints(words, WORDS + 16 * (8 + h))  # (16,) each
            lane = (8 + h) * LANES
            _carry(chains, at0 + lane, scaled_pairs(mins0, sums0), vmul(negative0, dx0))
            _carry(chains, tile_stride + at0 + lane, scaled_pairs(mins1, sums0), vmul(negative1, dx0))
            _carry(chains, at1 + lane, scaled_pairs(mins0, sums1), vmul(negative0, dx1))
            _carry(chains, tile_stride + at1 + lane, scaled_pairs(mins1, sums1), vmul(negative1, dx1))


@njit(inline="always", cache=KERNEL_CACHE)
def finish_tile(chains, base, n, out_flat, first, rows_total, r0, per_row, mins):  # pragma: no cover (compiled)
    """out[k, r0..r0+7] for x rows first..first+n-1 from chains of `per_row` vectors a row: vsum of the eight w
    chains, plus (mins) vsum of the four mins chains, in simd.vsum's order (lanes 4..7 of a mins chain are zeros
    there)."""
    zero = vzero()
    for i in range(n):
        at = base + i * per_row * LANES
        a0, a1, a2, a3 = vload(chains, at), vload(chains, at + 8), vload(chains, at + 16), vload(chains, at + 24)
        a4, a5, a6, a7 = vload(chains, at + 32), vload(chains, at + 40), vload(chains, at + 48), vload(chains, at + 56)
        total = vadd(vadd(vadd(a0, a4), vadd(a2, a6)), vadd(vadd(a1, a5), vadd(a3, a7)))
        if mins:
            m0, m1 = vload(chains, at + 64), vload(chains, at + 72)
            m2, m3 = vload(chains, at + 80), vload(chains, at + 88)
            total = vadd(total, vadd(vadd(vadd(m0, zero), vadd(m2, zero)), vadd(vadd(m1, zero), vadd(m3, zero))))
        vstore(out_flat, (first + i) * rows_total + r0, total)


@njit(inline="always", cache=KERNEL_CACHE)
def unpack_codes6(flat_low, flat_high, r0, s, half, raw, codes_out, spacing):  # pragma: no cover (compiled)
    """Super-block s's codes (0..63) of Q6_K rows r0..r0+7, interleaved as unpack_codes45's. raw (1536,) is
    scratch."""
    cols = 2 * half
    for t in range(4):  # low four bits: chunk t holds blocks 2(t//2)+t%2 (low nibbles) and that + 2 (high)
        transpose_rows(flat_low, r0 * half + s * (QK_K // 2) + 32 * t, half, raw, 256 * t)
    for u in range(2):  # bits 4-5: chunk u holds blocks 4u..4u+3, two bits each
        transpose_rows(flat_high, r0 * (cols // 4) + s * (QK_K // 4) + 32 * u, cols // 4, raw, 1024 + 256 * u)
    for c in range(8):
        for j in range(8):  # as int_kernels._q6k_codes orders them
            packed = load_ints(raw, 256 * (2 * (j // 4) + j % 2) + 32 * c)  # (32,) 8 rows x 4 bytes
            low = high4(packed) if (j // 2) % 2 else low4(packed)
            store_octets(codes_out, (8 * j + c) * spacing,
                         with_bits(low, load_ints(raw, 1024 + 256 * (j // 4) + 32 * c), 2 * (j % 4), 3))


@njit(inline="always", cache=KERNEL_CACHE)
def unpack_q6k(flat_low, flat_high, flat_scales, r0, s, half, raw, codes_out, words_out):  # pragma: no cover
    """Super-block s of Q6_K rows r0..r0+7: its codes as unpack_codes6 (spacing 32); words_out holds group g's
    sub-scale of each row (vector g < 16) and the paired offsets (transpose_offsets: vector 16 + p)."""
    groups = half // 8  # sub-scales per row
    unpack_codes6(flat_low, flat_high, r0, s, half, raw, codes_out, 32)
    transpose_scales(flat_scales, r0 * groups + 16 * s, groups, words_out, 0)  # groups 0..7
    transpose_scales(flat_scales, r0 * groups + 16 * s + 8, groups, words_out, 128)  # groups 8..15
    transpose_offsets(flat_scales, r0 * groups + 16 * s, groups, words_out, 256, 16)


@njit(inline="always", cache=KERNEL_CACHE)
def _half_sums6(codes, words, flat_q, qa0, qa1, h, half):  # pragma: no cover (compiled)
    """Q6_K's w[4 * half + h] before the -32 (as _half_sums; codes up to 63, so two pairs of products at most are
    summed in int16: 2 * 2 * 63 * 127 < 32768): groups 4h + half and 4h + 2 + half."""
    t00, t01, t10, t11 = izero(), izero(), izero(), izero()  # (tile, x row)
    for b in range(2):
        j = 2 * h + b
        g = 2 * j + half  # the group of block j's half
        s0, s1 = load_ints(words, 16 * g), load_ints(words, WORDS6 + 16 * g)  # (16,) each
        for p in range(2):
            at = (8 * j + 4 * half + 2 * p) * 32
            x0, x1 = qa0 + 32 * j + 16 * half + 8 * p, qa1 + 32 * j + 16 * half + 8 * p
            c0, c0n = load_ints(codes, at), load_ints(codes, at + 32)  # (32,) each
            c1, c1n = load_ints(codes, CODES_BYTES + at), load_ints(codes, CODES_BYTES + at + 32)  # (32,) each
            q0, q0n, q1, q1n = (quad_splat(flat_q, x0), quad_splat(flat_q, x0 + 4), quad_splat(flat_q, x1),
                                quad_splat(flat_q, x1 + 4))  # (32,) each
            t00 = iadd(t00, scaled_pairs(add16(pair_sums(c0, q0), pair_sums(c0n, q0n)), s0))
            t01 = iadd(t01, scaled_pairs(add16(pair_sums(c0, q1), pair_sums(c0n, q1n)), s0))
            t10 = iadd(t10, scaled_pairs(add16(pair_sums(c1, q0), pair_sums(c1n, q0n)), s1))
            t11 = iadd(t11, scaled_pairs(add16(pair_sums(c1, q1), pair_sums(c1n, q1n)), s1))
    return t00, t01, t10, t11


@njit(inline="always", cache=KERNEL_CACHE)
def q6k_tiles(codes, words, d, r0, s, flat_q, flat_dx8, flat_sums, cols, first, n, chains,
              tile_stride):  # pragma: no cover (compiled)
    """Carry the Q6_K chains of two tiles (rows r0..r0+15, unpacked by unpack_q6k) and x rows first..first+n-1 over
    super-block s, as q45k_tiles (CHAINS6 a row, slot n spare)."""
    supers = cols // QK_K
    flat_d = d.reshape(-1)
    scale0 = row_floats(flat_d, r0 * supers + s, supers)  # (8,) d of each row
    scale1 = row_floats(flat_d, (r0 + TILE_ROWS) * supers + s, supers)  # (8,)
    for i in range(0, n, 2):
        k0, k1 = first + i, first + min(i + 1, n - 1)
        at0, at1 = i * CHAINS6 * LANES, (i + 1) * CHAINS6 * LANES
        for h in range(4):
            dx0 = vbroadcast(flat_dx8[(k0 * supers + s) * LANES + h])  # (8,)
            dx1 = vbroadcast(flat_dx8[(k1 * supers + s) * LANES + h])  # (8,)
            for half in range(2):
                w00, w01, w10, w11 = _half_sums6(codes, words, flat_q, k0 * cols + s * QK_K, k1 * cols + s * QK_K,
                                                 h, half)  # (8,) int32 each
                sums = k0 * (cols // 16) + 16 * s + 4 * h + 2 * half  # groups 4h + half and 4h + 2 + half, paired
                offsets0 = load_ints(words, 16 * (16 + 2 * h + half))  # (16,)
                offsets1 = load_ints(words, WORDS6 + 16 * (16 + 2 * h + half))  # (16,)
                sums0 = pair_splat(flat_sums, sums)  # (16,)
                sums1 = pair_splat(flat_sums, sums + (k1 - k0) * (cols // 16))  # (16,)
                lane = (4 * half + h) * LANES
                _carry(chains, at0 + lane, isub(w00, scaled_pairs(offsets0, sums0)), vmul(scale0, dx0))
                _carry(chains, tile_stride + at0 + lane, isub(w10, scaled_pairs(offsets1, sums0)), vmul(scale1, dx0))
                _carry(chains, at1 + lane, isub(w01, scaled_pairs(offsets0, sums1)), vmul(scale0, dx1))
                _carry(chains, tile_stride + at1 + lane, isub(w11, scaled_pairs(offsets1, sums1)), vmul(scale1, dx1))


@njit(inline="always", cache=KERNEL_CACHE)
def prefetch_task(flat_codes, low, s, supers, half, rows):  # pragma: no cover (compiled)
    """Ask for the codes of super-block s + PREFETCH_AHEAD of rows low..low+15, or past the row's end, of the next
    task's rows (most often this thread's next task)."""
    ahead = s + PREFETCH_AHEAD
    ahead_row = low if ahead < supers else low + 2 * TILE_ROWS
    if ahead_row + 2 * TILE_ROWS <= rows:
        prefetch_rows(flat_codes, ahead_row * half + (ahead % supers) * (QK_K // 2), half, 2 * TILE_ROWS)


@njit(inline="always", cache=KERNEL_CACHE)
def q45k_task(flat_codes, flat_fifth, scales, flat_mins, d, dmin, flat_q, flat_dx8, flat_sums, flat_out, half, low,
              first, last):  # pragma: no cover (compiled)
    """out[k, low..low+15] for x rows first..last-1 of a Q4_K (or Q5_K) matrix: int_kernels._q4k's task, in tiles."""
    rows, supers = d.shape
    codes = np.empty(2 * CODES_BYTES, np.uint8)  # (4096,) a super-block of sixteen rows, unpacked
    words = np.empty(2 * WORDS, np.int16)  # (384,) their sub-scales and mins
    raw = np.empty(RAW_BYTES, np.uint8)  # (1280,) packed bytes, transposed
    stride = (X_ROWS + 1) * CHAINS * LANES  # a tile's chains (and a spare x row's)
    chains = np.empty(2 * stride, np.float32)  # (2*17*12*8,)
    for x0 in range(first, last, X_ROWS):
        n = min(X_ROWS, last - x0)
        chains[:] = 0
        for s in range(supers):
            if x0 == first:  # later passes find the codes in L2
                prefetch_task(flat_codes, low, s, supers, half, rows)
            for t in range(2):
                unpack_q45k(flat_codes, flat_fifth, scales, flat_mins, low + TILE_ROWS * t, s, half, raw,
                            codes[t * CODES_BYTES:], words[t * WORDS:])
            q45k_tiles(codes, words, d, dmin, low, s, flat_q, flat_dx8, flat_sums, 2 * half, x0, n, chains, stride)
        for t in range(2):
            finish_tile(chains, t * stride, n, flat_out, x0, rows, low + TILE_ROWS * t, CHAINS, True)


@njit(inline="always", cache=KERNEL_CACHE)
def q6k_task(flat_low, flat_high, flat_scales, d, flat_q, flat_dx8, flat_sums, flat_out, half, low, first,
             last):  # pragma: no cover (compiled)
    """out[k, low..low+15] for x rows first..last-1 of a Q6_K matrix: int_kernels._q6k's task, in tiles."""
    rows, supers = d.shape
    codes = np.empty(2 * CODES_BYTES, np.uint8)  # (4096,) a super-block of sixteen rows, unpacked
    words = np.empty(2 * WORDS6, np.int16)  # (768,) their sub-scales and paired offsets
    raw = np.empty(RAW6_BYTES, np.uint8)  # (1536,) packed bytes, transposed
    stride = (X_ROWS + 1) * CHAINS6 * LANES  # a tile's chains (and a spare x row's)
    chains = np.empty(2 * stride, np.float32)  # (2*17*8*8,)
    for x0 in range(first, last, X_ROWS):
        n = min(X_ROWS, last - x0)
        chains[:] = 0
        for s in range(supers):
            if x0 == first:
                prefetch_task(flat_low, low, s, supers, half, rows)
            for t in range(2):
                unpack_q6k(flat_low, flat_high, flat_scales, low + TILE_ROWS * t, s, half, raw,
                           codes[t * CODES_BYTES:], words[t * WORDS6:])
            q6k_tiles(codes, words, d, low, s, flat_q, flat_dx8, flat_sums, 2 * half, x0, n, chains, stride)
        for t in range(2):
            finish_tile(chains, t * stride, n, flat_out, x0, rows, low + TILE_ROWS * t, CHAINS6, False)
