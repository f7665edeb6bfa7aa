"""Integer matmuls over K-quant super-blocks (k_blocks.py): x (N, C) times a Q4_K or Q6_K matrix (R, C) transposed,
with x quantized to int8 per 64 columns (llama.cpp's Q8_K has one scale per 256; a finer one keeps our error well
inside llama.cpp's at about the same speed) and every product of codes and activations summed in integers
(simd_int.py: vpmaddubsw + vpmaddwd on AVX2). One kernel serves every width, decode and prefill alike.

THE REDUCTION (every tile computes exactly this, so a row's result never depends on the rest of its step):

    activations, per row k and quarter super-block h (64 columns): dx = max|x| / 127,
      q = rint(x * (127 / max|x|)) (0 when max is 0), sums16/sums32[k, j] = the sum of q over column group j;
    per weight row r, x row k, super-block s (quarters h = 4s .. 4s+3), in order s = 0, 1, ..:
      lanes_h[l] = sum over h's two 32-column blocks b of  sc[b-part] * (c q over columns 4l..4l+3 of b)
                   (integers, exact: see simd_int.dot_scaled)
      acc = fma(float(lanes_h), d[r, s] * dx[k, h], acc)            for h = 4s .. 4s+3, in order
      Q4_K: macc = fma(float(m[r, s, j] * sums32[k, 8s+j]), dmin[r, s] * dx[k, 4s + j//2] in lane j, macc)
      Q6_K (codes are unsigned: the -32 comes off as 32 * sum_j sc[j] * sums16[k, j]):
            macc = fma(float(sc[r, 16s+l] * sums16[k, 16s+l]), d[r, s] * dx[k, 4s + l//4] in lane l, macc);
            macc = fma(float(sc[r, 16s+8+l] * sums16[k, 16s+8+l]), d[r, s] * dx[k, 4s + 2 + l//4], macc)
    out[k, r] = vsum(acc) - vsum(macc)   (Q6_K: vsum(acc) - 32 * vsum(macc))

`reference_matmul` is the same arithmetic in numpy. Parallelism: weight rows across threads; every (r, k) pair is
one chain, computed by one thread in one order.
"""

from __future__ import annotations

import logging

import numpy as np
from numba import njit, prange

from worker.engine.k_blocks import KBlocks
from worker.engine.numba_runtime import launch_lock
from worker.engine.quant_blocks import QK_K
from worker.engine.simd import LANES, vbroadcast, vfma, vload, vstore, vsum
from worker.engine.simd_int import (
    PATHS,
    detected_path,
    dot_scaled,
    iadd,
    ifloat,
    imul,
    int_path,
    isplat16,
    iwiden8,
    nibbles32,
    sixbits32,
    vquarters,
)

ROW_CHUNK = 64  # x rows per pass over the weights (their int8 codes stay in L2 while every weight row meets them)
ROWS_PER_TASK = 16  # weight rows a parallel task takes (one scratch allocation each)
ACT_BLOCK = 64  # activation columns per int8 scale (four per super-block)
# numba's on-disk cache is keyed on the CPU, not on LLMFLEET_INT_KERNELS: a forced path compiles afresh each process
_CACHE = int_path() == detected_path()
log = logging.getLogger(__name__)


@njit(cache=True, fastmath={"nnan", "ninf", "nsz"})
def _quantize(x, q, dx, sums16, sums32):  # pragma: no cover (compiled)
    """q, dx and the sums over 16 and 32 columns of every row of x (N, C), as the module docstring defines them.
    (The fastmath flags let LLVM vectorise the max; they change no rounding: no reassociation, no contraction.)"""
    n_rows, cols = x.shape
    for k in range(n_rows):
        for h in range(cols // ACT_BLOCK):
            amax = np.float32(0.0)
            for c in range(h * ACT_BLOCK, (h + 1) * ACT_BLOCK):
                amax = max(amax, abs(x[k, c]))
            inverse = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            dx[k, h] = amax / np.float32(127.0)
            for c in range(h * ACT_BLOCK, (h + 1) * ACT_BLOCK):
                q[k, c] = np.int8(np.rint(x[k, c] * inverse))
        for j in range(cols // 16):
            total = np.int32(0)
            for c in range(16 * j, 16 * j + 16):
                total += np.int32(q[k, c])
            sums16[k, j] = total
        for j in range(cols // 32):
            sums32[k, j] = sums16[k, 2 * j] + sums16[k, 2 * j + 1]


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (N, C) float32 as int8 codes q (N, C), a float32 scale per 128 columns dx (N, C/128) and int32 sums of q
    per 16 and per 32 columns (N, C/16), (N, C/32)."""
    n_rows, cols = x.shape
    q = np.empty((n_rows, cols), np.int8)  # (N, C)
    dx = np.empty((n_rows, cols // ACT_BLOCK), np.float32)  # (N, C/128)
    sums16 = np.empty((n_rows, cols // 16), np.int32)  # (N, C/16)
    sums32 = np.empty((n_rows, cols // 32), np.int32)  # (N, C/32)
    _quantize(np.ascontiguousarray(x, dtype=np.float32), q, dx, sums16, sums32)
    return q, dx, sums16, sums32


@njit(cache=_CACHE, inline="always")
def _part_lanes(flat_q, qa, ca, cb, sa, sb):  # pragma: no cover (compiled)
    """The int32x8 lanes of a quarter super-block: two blocks' codes ca, cb (int8x32) and sub-scales sa, sb
    (int16x16) against the 64 activations at flat_q[qa]."""
    return iadd(dot_scaled(ca, flat_q, qa, sa), dot_scaled(cb, flat_q, qa + 32, sb))


@njit(cache=_CACHE, inline="always")
def _four_parts(acc, at, flat_q, qa, f, dx, k, h, c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7):  # pragma: no cover
    """acc[at:at+8] carried over one super-block: its four quarters' lanes, each times f * dx[k, h + p]."""
    chain = vload(acc, at)  # (8,)
    chain = vfma(ifloat(_part_lanes(flat_q, qa, c0, c1, s0, s1)), vbroadcast(f * dx[k, h]), chain)
    chain = vfma(ifloat(_part_lanes(flat_q, qa + 64, c2, c3, s2, s3)), vbroadcast(f * dx[k, h + 1]), chain)
    chain = vfma(ifloat(_part_lanes(flat_q, qa + 128, c4, c5, s4, s5)), vbroadcast(f * dx[k, h + 2]), chain)
    vstore(acc, at, vfma(ifloat(_part_lanes(flat_q, qa + 192, c6, c7, s6, s7)), vbroadcast(f * dx[k, h + 3]), chain))


@njit(cache=_CACHE, inline="always")
def _q4k_row(flat_codes, scales, flat_mins, d, dmin, flat_q, dx, flat_sums, r, half, first, n, acc, macc, out):  # pragma: no cover
    """out[first:first+n, r]: weight row r against n x rows (chains in the scratch acc, macc: (n*8,) each)."""
    cols = 2 * half
    acc[:] = 0
    macc[:] = 0
    for s in range(cols // QK_K):
        g = 8 * s
        at = r * half + s * (QK_K // 2)
        c0, c1, c2, c3 = (nibbles32(flat_codes, at), nibbles32(flat_codes, at + 16),
                          nibbles32(flat_codes, at + 32), nibbles32(flat_codes, at + 48))
        c4, c5, c6, c7 = (nibbles32(flat_codes, at + 64), nibbles32(flat_codes, at + 80),
                          nibbles32(flat_codes, at + 96), nibbles32(flat_codes, at + 112))
        s0, s1 = isplat16(scales[r, g], scales[r, g]), isplat16(scales[r, g + 1], scales[r, g + 1])
        s2, s3 = isplat16(scales[r, g + 2], scales[r, g + 2]), isplat16(scales[r, g + 3], scales[r, g + 3])
        s4, s5 = isplat16(scales[r, g + 4], scales[r, g + 4]), isplat16(scales[r, g + 5], scales[r, g + 5])
        s6, s7 = isplat16(scales[r, g + 6], scales[r, g + 6]), isplat16(scales[r, g + 7], scales[r, g + 7])
        m = iwiden8(flat_mins, r * (cols // 32) + g)  # (8,) int32 mins of the super-block
        for i in range(n):
            k = first + i
            h = 4 * s
            _four_parts(acc, i * LANES, flat_q, k * cols + s * QK_K, d[r, s], dx, k, h,
                        c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7)
            low = imul(m, iwiden8(flat_sums, k * (cols // 32) + g))  # (8,) m[j] * sum of q over group j
            e = dmin[r, s]
            factor = vquarters(e * dx[k, h], e * dx[k, h + 1], e * dx[k, h + 2], e * dx[k, h + 3])  # (8,)
            vstore(macc, i * LANES, vfma(ifloat(low), factor, vload(macc, i * LANES)))
    for i in range(n):
        out[first + i, r] = vsum(vload(acc, i * LANES)) - vsum(vload(macc, i * LANES))


@njit(parallel=True, cache=_CACHE)
def _q4k(codes, scales, mins, d, dmin, q, dx, sums32, first, last, out):  # pragma: no cover (compiled)
    """out[k, r] for x rows first..last-1: the Q4_K reduction of the module docstring (a super-block's codes
    unpacked once, then met by every x row; ROWS_PER_TASK weight rows a task, sharing its scratch)."""
    rows, half = codes.shape  # codes (R, C/2); scales/mins (R, C/32) uint8; d/dmin (R, C/256)
    flat_codes = codes.reshape(-1)  # (R*C/2,)
    flat_q = q.reshape(-1)  # (N*C,)
    flat_sums = sums32.reshape(-1)  # (N*C/32,)
    flat_mins = mins.reshape(-1)  # (R*C/32,)
    n = last - first
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        acc = np.empty(n * LANES, np.float32)  # (n*8,) one chain per x row
        macc = np.empty(n * LANES, np.float32)  # (n*8,)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            _q4k_row(flat_codes, scales, flat_mins, d, dmin, flat_q, dx, flat_sums, r, half, first, n, acc, macc, out)


@njit(cache=_CACHE, inline="always")
def _q6k_row(flat_low, flat_high, scales, flat_scales, d, flat_q, dx, flat_sums, r, half, first, n, acc, macc, out):  # pragma: no cover
    """out[first:first+n, r]: weight row r against n x rows (chains in the scratch acc, macc: (n*8,) each)."""
    cols = 2 * half
    acc[:] = 0
    macc[:] = 0
    for s in range(cols // QK_K):
        g = 16 * s
        at = r * half + s * (QK_K // 2)
        ha = r * (cols // 4) + s * (QK_K // 4)
        c0, c1 = sixbits32(flat_low, at, flat_high, ha), sixbits32(flat_low, at + 16, flat_high, ha + 8)
        c2, c3 = sixbits32(flat_low, at + 32, flat_high, ha + 16), sixbits32(flat_low, at + 48, flat_high, ha + 24)
        c4, c5 = sixbits32(flat_low, at + 64, flat_high, ha + 32), sixbits32(flat_low, at + 80, flat_high, ha + 40)
        c6, c7 = sixbits32(flat_low, at + 96, flat_high, ha + 48), sixbits32(flat_low, at + 112, flat_high, ha + 56)
        s0, s1 = isplat16(scales[r, g], scales[r, g + 1]), isplat16(scales[r, g + 2], scales[r, g + 3])
        s2, s3 = isplat16(scales[r, g + 4], scales[r, g + 5]), isplat16(scales[r, g + 6], scales[r, g + 7])
        s4, s5 = isplat16(scales[r, g + 8], scales[r, g + 9]), isplat16(scales[r, g + 10], scales[r, g + 11])
        s6, s7 = isplat16(scales[r, g + 12], scales[r, g + 13]), isplat16(scales[r, g + 14], scales[r, g + 15])
        sc_low = iwiden8(flat_scales, r * (cols // 16) + g)  # (8,) sub-scales 0..7 of the super-block
        sc_high = iwiden8(flat_scales, r * (cols // 16) + g + 8)  # (8,) 8..15
        for i in range(n):
            k = first + i
            h = 4 * s
            _four_parts(acc, i * LANES, flat_q, k * cols + s * QK_K, d[r, s], dx, k, h,
                        c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7)
            sa = k * (cols // 16) + g
            f = d[r, s]
            f0, f1, f2, f3 = f * dx[k, h], f * dx[k, h + 1], f * dx[k, h + 2], f * dx[k, h + 3]
            chain = vfma(ifloat(imul(sc_low, iwiden8(flat_sums, sa))), vquarters(f0, f0, f1, f1),
                         vload(macc, i * LANES))  # groups 0..7: sub-scale times the sum of q, for the codes' -32
            vstore(macc, i * LANES, vfma(ifloat(imul(sc_high, iwiden8(flat_sums, sa + 8))), vquarters(f2, f2, f3, f3),
                                         chain))
    for i in range(n):
        out[first + i, r] = vsum(vload(acc, i * LANES)) - np.float32(32.0) * vsum(vload(macc, i * LANES))


@njit(parallel=True, cache=_CACHE)
def _q6k(codes, high, scales, d, q, dx, sums16, first, last, out):  # pragma: no cover (compiled)
    """out[k, r] for x rows first..last-1: the Q6_K reduction of the module docstring."""
    rows, half = codes.shape  # codes (R, C/2); high (R, C/4); scales (R, C/16) int8; d (R, C/256)
    flat_low = codes.reshape(-1)  # (R*C/2,)
    flat_high = high.reshape(-1)  # (R*C/4,)
    flat_scales = scales.reshape(-1)  # (R*C/16,)
    flat_q = q.reshape(-1)  # (N*C,)
    flat_sums = sums16.reshape(-1)  # (N*C/16,)
    n = last - first
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        acc = np.empty(n * LANES, np.float32)  # (n*8,)
        macc = np.empty(n * LANES, np.float32)  # (n*8,)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            _q6k_row(flat_low, flat_high, scales, flat_scales, d, flat_q, dx, flat_sums, r, half, first, n, acc, macc,
                     out)


def k_matmul(x: np.ndarray, blocks: KBlocks) -> np.ndarray:
    """x (N, C) times the K-quant matrix (R, C) transposed: (N, R), row-major."""
    n_rows, cols = x.shape
    if blocks.shape[1] != cols or cols % QK_K:
        raise ValueError(f"{blocks.kind} matrix {blocks.shape} does not fit x {x.shape}")
    q, dx, sums16, sums32 = quantize_rows(x)
    out = np.empty((n_rows, blocks.shape[0]), np.float32)  # (N, R)
    with launch_lock:
        for first in range(0, n_rows, ROW_CHUNK):
            last = min(n_rows, first + ROW_CHUNK)
            if blocks.kind == "Q4_K":
                _q4k(blocks.codes, blocks.scales, blocks.mins, blocks.d, blocks.dmin, q, dx, sums32, first, last, out)
            else:
                _q6k(blocks.codes, blocks.high, blocks.scales, blocks.d, q, dx, sums16, first, last, out)
    return out


def reference_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """quantize_rows in numpy."""
    x = np.asarray(x, np.float32)
    n_rows, cols = x.shape
    blocks = x.reshape(n_rows, cols // ACT_BLOCK, ACT_BLOCK)  # (N, H, 128)
    amax = np.abs(blocks).max(axis=2)  # (N, H)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)  # (N, H)
    dx = (amax / np.float32(127.0)).astype(np.float32)  # (N, H)
    q = np.rint((blocks * inverse[:, :, None]).astype(np.float32)).astype(np.int8).reshape(n_rows, cols)  # (N, C)
    sums16 = q.reshape(n_rows, cols // 16, 16).astype(np.int32).sum(axis=2, dtype=np.int32)  # (N, C/16)
    sums32 = sums16.reshape(n_rows, cols // 32, 2).sum(axis=2, dtype=np.int32)  # (N, C/32)
    return q, dx, sums16, sums32


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once (the float64 product of two float32 is exact)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _vsum(acc: np.ndarray) -> np.ndarray:
    """simd.vsum over the last axis (8 lanes) in float32."""
    half = acc[..., :4] + acc[..., 4:]  # (.., 4)
    quarter = half[..., :2] + half[..., 2:]  # (.., 2)
    return quarter[..., 0] + quarter[..., 1]


def reference_matmul(x: np.ndarray, blocks: KBlocks) -> np.ndarray:
    """k_matmul's arithmetic in numpy, step by step: (N, R)."""
    q, dx, sums16, sums32 = reference_quantize(x)
    rows, cols = blocks.shape
    n_rows, supers = q.shape[0], cols // QK_K
    codes = blocks.code_rows().astype(np.int64).reshape(rows, 1, supers, 8, 8, 4)  # (R, 1, S, block, lane, 4)
    products = (codes * q.astype(np.int64).reshape(1, n_rows, supers, 8, 8, 4)).sum(axis=5)  # (R, N, S, 8, 8)
    scales = blocks.scales.astype(np.int64)
    if blocks.kind == "Q4_K":
        per_block = scales.reshape(rows, 1, supers, 8, 1)  # (R, 1, S, block, 1)
    else:  # a block's lanes 0..3 are its first group of 16, lanes 4..7 its second
        per_block = np.repeat(scales.reshape(rows, 1, supers, 8, 2), 4, axis=4)  # (R, 1, S, block, lane)
    parts = 256 // ACT_BLOCK  # activation blocks per super-block
    weighted = (products * per_block).reshape(rows, n_rows, supers, parts, 8 // parts, LANES)  # (R, N, S, P, b, 8)
    lanes = weighted.sum(axis=4)  # (R, N, S, P, 8)
    scaled_dx = dx.reshape(n_rows, supers, parts)  # (N, S, P)
    factor = (blocks.d[:, None, :, None] * scaled_dx[None, :, :, :]).astype(np.float32)  # (R, N, S, P)
    acc = np.zeros((rows, n_rows, LANES), np.float32)  # (R, N, 8)
    macc = np.zeros((rows, n_rows, LANES), np.float32)  # (R, N, 8)
    for s in range(supers):
        for p in range(parts):
            acc = _fma(lanes[:, :, s, p].astype(np.float32), factor[:, :, s, p, None], acc)
        if blocks.kind == "Q4_K":  # lane j: group j of 32, in quarter j // 2
            assert blocks.mins is not None and blocks.dmin is not None
            low = blocks.mins.astype(np.int64)[:, None, 8 * s : 8 * s + 8] * sums32[None, :, 8 * s : 8 * s + 8]
            mfactor = (blocks.dmin[:, None, s, None] * scaled_dx[None, :, s, :]).astype(np.float32)  # (R, N, P)
            macc = _fma(low.astype(np.float32), np.repeat(mfactor, 8 // parts, axis=2), macc)
        else:  # lane l of each half: group of 16 l (or 8 + l), in quarter l // 4 (or 2 + l // 4)
            for h in range(2):
                sub = scales[:, None, s * 16 + 8 * h : s * 16 + 8 * h + 8] * sums16[None, :, s * 16 + 8 * h : s * 16 + 8 * h + 8]
                macc = _fma(sub.astype(np.float32), np.repeat(factor[:, :, s, 2 * h : 2 * h + 2], 4, axis=2), macc)
    out = _vsum(acc) - (_vsum(macc) if blocks.kind == "Q4_K" else np.float32(32.0) * _vsum(macc))  # (R, N)
    return np.ascontiguousarray(out.T)  # (N, R)


def warm() -> None:
    """Compile (or load from numba's cache) both kernels for writeable and for read-only (mapped) arrays, and log
    the instruction path once."""
    log.info("integer kernels: %s path (LLMFLEET_INT_KERNELS=%s forces one)", int_path(), "|".join(PATHS))
    for kind in ("Q4_K", "Q6_K"):
        for writeable in (True, False):
            blocks = _zero_blocks(kind)
            for array in blocks.arrays().values():
                array.flags.writeable = writeable
            k_matmul(np.zeros((1, QK_K), np.float32), blocks)


def _zero_blocks(kind: str) -> KBlocks:
    """A one-row zero matrix of a kind (for warming the kernels)."""
    rows = 1
    if kind == "Q4_K":
        return KBlocks(kind, np.zeros((rows, QK_K // 2), np.uint8), np.zeros((rows, 8), np.uint8),
                       np.zeros((rows, 1), np.float32), mins=np.zeros((rows, 8), np.uint8),
                       dmin=np.zeros((rows, 1), np.float32))
    return KBlocks(kind, np.zeros((rows, QK_K // 2), np.uint8), np.zeros((rows, 16), np.int8),
                   np.zeros((rows, 1), np.float32), high=np.zeros((rows, QK_K // 4), np.uint8))
