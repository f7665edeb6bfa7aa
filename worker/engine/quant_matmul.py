"""Integer matmuls on the file's own quantized blocks: x (K, C) times a GGUF matrix (R, C) kept as its raw bytes.

Activations are quantized per row and per block of 32 to int8 (as llama.cpp's Q8_0/Q8_1: d = max|x| / 127,
q = rint(x / d), plus the integer sum of each half-block of 16 for the formats with an offset). For every one
of the eight formats the kernel unpacks a tile of TILE weight rows from the mapped bytes into int8 codes with a
float32 scale and offset per 16 weights (L1 scratch, never a whole matrix), then per output and per block of 32:
two integer dot products of 16 (int8 x int8 -> int32, vectorised by LLVM), one float combination
`d_x * (s0 * dot0 + o0 * sum0 + s1 * dot1 + o1 * sum1)`, and a float sum over blocks in block order.

Batch invariance: a row's activation quantization depends on that row alone, integer sums are exact, and the
float operations of one output run in one fixed order, compiled without fastmath (no reassociation, no
contraction) and identical for every row count: a row's result is bit-identical whether its step has 1 or 500
rows. The 32-activation block is finer than llama.cpp's Q8_K (256) for the K-quants, so no less accurate.

Formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32), Q4_K, Q5_K (256, sub-blocks of 32), Q6_K (256, 16).
quant_reference.py holds the numpy reference the tests compare every kernel with.
"""

from __future__ import annotations

import logging

import numpy as np
from numba import njit, prange

from worker.engine.kernels import launch_lock
from worker.engine.simd import widen

log = logging.getLogger(__name__)

KINDS = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2, "Q5_1": 3, "Q8_0": 4, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7}
BLOCK_BYTES = (18, 20, 22, 24, 34, 144, 176, 210)  # bytes per block, by kind
BLOCK_WEIGHTS = (32, 32, 32, 32, 32, 256, 256, 256)  # weights per block, by kind
QBLOCK = 32  # columns per step of the kernel's block loop (the 32-weight formats' block)
XBLOCK = 16  # activations per int8 scale: finer than llama.cpp's 32 (Q8_0/Q8_1) and 256 (Q8_K)
TILE = 8  # weight rows a task unpacks at once (8 x 1536 int8 = 12 KiB of codes for SmolLM2: L1)


@njit(cache=True)
def quantize_rows(x, xq, xd, xs):  # pragma: no cover (compiled)
    """x (K, C) float32 -> int8 codes xq (K, C), a scale per 16 xd (K, C/16), integer sums per 16 xs (K, C/16)."""
    n, cols = x.shape
    for k in range(n):
        for b in range(cols // XBLOCK):
            base = b * XBLOCK
            amax = np.float32(0.0)
            for i in range(XBLOCK):
                amax = max(amax, abs(x[k, base + i]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            xd[k, b] = d
            total = 0
            for i in range(XBLOCK):
                q = np.int32(np.rint(x[k, base + i] * inv))
                xq[k, base + i] = q
                total += q
            xs[k, b] = total


@njit(cache=True, inline="always")
def _signed(byte):  # pragma: no cover (compiled)
    """A byte read as int8 (two's complement), as an int32."""
    v = np.int32(byte)
    return v - ((v >> 7) << 8)


@njit(cache=True, inline="always")
def _k_scale_min(raw, r, p, j):  # pragma: no cover (compiled)
    """The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block starting at byte p of row r."""
    s = p + 4
    if j < 4:
        return raw[r, s + j] & 63, raw[r, s + j + 4] & 63
    sc = (raw[r, s + j + 4] & 15) | ((raw[r, s + j - 4] >> 6) << 4)
    mn = (raw[r, s + j + 4] >> 4) | ((raw[r, s + j] >> 6) << 4)
    return sc, mn


@njit(cache=True)
def _unpack_legacy(kind, raw, halves, r, codes, j, scales, offsets):  # pragma: no cover (compiled)
    """Codes (C,) int8 and per-16 scale/offset of weight row r of a 32-weight format into scratch row j."""
    size = BLOCK_BYTES[kind]
    for b in range(raw.shape[1] // size):
        p = b * size
        c = b * 32
        d = widen(halves[r, p // 2])
        m = np.float32(0.0)
        if kind == 1 or kind == 3:
            m = widen(halves[r, p // 2 + 1])
        if kind == 4:
            for i in range(32):
                codes[j, c + i] = _signed(raw[r, p + 2 + i])
        elif kind <= 1:
            at = p + 2 + 2 * kind
            shift = 8 if kind == 0 else 0
            for i in range(16):
                q = np.int32(raw[r, at + i])
                codes[j, c + i] = (q & 15) - shift
                codes[j, c + 16 + i] = (q >> 4) - shift
        else:
            at = p + 2 + 2 * (kind - 2)
            qh = (np.uint32(raw[r, at]) | (np.uint32(raw[r, at + 1]) << 8) | (np.uint32(raw[r, at + 2]) << 16)
                  | (np.uint32(raw[r, at + 3]) << 24))
            shift = 16 if kind == 2 else 0
            for i in range(16):
                q = np.int32(raw[r, at + 4 + i])
                codes[j, c + i] = ((q & 15) | (np.int32((qh >> i) & 1) << 4)) - shift
                codes[j, c + 16 + i] = ((q >> 4) | (np.int32((qh >> (i + 16)) & 1) << 4)) - shift
        scales[j, 2 * b] = d
        scales[j, 2 * b + 1] = d
        offsets[j, 2 * b] = m
        offsets[j, 2 * b + 1] = m


@njit(cache=True)
def _unpack_k(kind, raw, halves, r, codes, j, scales, offsets):  # pragma: no cover (compiled)
    """The same for the 256-weight K formats (Q4_K, Q5_K: 8 sub-blocks of 32; Q6_K: 16 of 16)."""
    size = BLOCK_BYTES[kind]
    for b in range(raw.shape[1] // size):
        p = b * size
        c = b * 256
        if kind == 7:
            d = widen(halves[r, (p + 208) // 2])
            for t in range(16):
                scales[j, 16 * b + t] = d * np.float32(_signed(raw[r, p + 192 + t]))
                offsets[j, 16 * b + t] = np.float32(0.0)
            for h in range(2):
                for i in range(32):
                    low0 = np.int32(raw[r, p + 64 * h + i])
                    low1 = np.int32(raw[r, p + 64 * h + 32 + i])
                    high = np.int32(raw[r, p + 128 + 32 * h + i])
                    e = c + 128 * h + i
                    codes[j, e] = ((low0 & 15) | ((high & 3) << 4)) - 32
                    codes[j, e + 32] = ((low1 & 15) | (((high >> 2) & 3) << 4)) - 32
                    codes[j, e + 64] = ((low0 >> 4) | (((high >> 4) & 3) << 4)) - 32
                    codes[j, e + 96] = ((low1 >> 4) | (((high >> 6) & 3) << 4)) - 32
            continue
        d = widen(halves[r, p // 2])
        dmin = widen(halves[r, p // 2 + 1])
        at = p + 16 if kind == 5 else p + 48
        for s in range(8):
            sc, mn = _k_scale_min(raw, r, p, s)
            scales[j, 16 * b + 2 * s] = scales[j, 16 * b + 2 * s + 1] = d * np.float32(sc)
            offsets[j, 16 * b + 2 * s] = offsets[j, 16 * b + 2 * s + 1] = -(dmin * np.float32(mn))
            chunk = at + 32 * (s // 2)
            for i in range(32):
                q = np.int32(raw[r, chunk + i])
                q = (q & 15) if s % 2 == 0 else (q >> 4)
                if kind == 6:
                    q |= ((np.int32(raw[r, p + 16 + i]) >> s) & 1) << 4
                codes[j, c + 32 * s + i] = q


@njit(cache=True, inline="always")
def _dot16(codes, j, xq, k, c):  # pragma: no cover (compiled)
    """The integer dot product of 16 weight codes and 16 activation codes from column c."""
    total = np.int32(0)
    for i in range(16):
        total += np.int32(np.int16(codes[j, c + i]) * np.int16(xq[k, c + i]))
    return total


@njit(parallel=True, cache=True)
def _matmul(kind, raw, halves, xq, xd, xs, out):  # pragma: no cover (compiled)
    """out[k, r] = sum over blocks of 32 (in order) of d0 (s0 dot0 + o0 sum0) + d1 (s1 dot1 + o1 sum1), per half."""
    rows = raw.shape[0]
    n, cols = xq.shape
    n_blocks = cols // QBLOCK
    n_tiles = (rows + TILE - 1) // TILE
    for tile in prange(n_tiles):
        first = tile * TILE
        count = min(rows, first + TILE) - first
        codes = np.empty((TILE, cols), np.int8)  # (T, C) this tile's weight codes
        scales = np.empty((TILE, cols // 16), np.float32)  # (T, C/16)
        offsets = np.empty((TILE, cols // 16), np.float32)  # (T, C/16)
        for j in range(count):
            if kind < 5:
                _unpack_legacy(kind, raw, halves, first + j, codes, j, scales, offsets)
            else:
                _unpack_k(kind, raw, halves, first + j, codes, j, scales, offsets)
        for k in range(n):
            for j in range(count):
                acc = np.float32(0.0)
                for b in range(n_blocks):
                    h = 2 * b
                    c = b * QBLOCK
                    dot0 = np.float32(_dot16(codes, j, xq, k, c))
                    dot1 = np.float32(_dot16(codes, j, xq, k, c + 16))
                    part0 = scales[j, h] * dot0 + offsets[j, h] * np.float32(xs[k, h])
                    part1 = scales[j, h + 1] * dot1 + offsets[j, h + 1] * np.float32(xs[k, h + 1])
                    acc += xd[k, h] * part0 + xd[k, h + 1] * part1
                out[k, first + j] = acc


class QuantizedActivations:
    """x (K, C) quantized once for every matmul that takes it (q, k and v; gate and up)."""

    def __init__(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)  # (K, C)
        n, cols = x.shape
        if cols % QBLOCK:
            raise ValueError(f"{cols} columns are not a whole number of {QBLOCK}-blocks")
        self.q = np.empty((n, cols), np.int8)  # (K, C)
        self.d = np.empty((n, cols // XBLOCK), np.float32)  # (K, C/16)
        self.sums = np.empty((n, cols // 16), np.int32)  # (K, C/16)
        quantize_rows(x, self.q, self.d, self.sums)


def quant_matmul(x: QuantizedActivations, kind: str, raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x (K, C) times the GGUF matrix whose rows are raw (R, bytes per row) of type `kind`, transposed: (K, R)."""
    code = KINDS[kind]
    if out is None:
        out = np.empty((x.q.shape[0], raw.shape[0]), np.float32)  # (K, R)
    halves = raw.view(np.uint16)  # (R, bytes/2): every half-float field sits at an even offset
    with launch_lock:
        _matmul(code, raw, halves, x.q, x.d, x.sums, out)
    return out


def warm(kinds: set[str]) -> None:
    """Compile (or load from numba's cache) the kernels, and log the path taken once."""
    x = QuantizedActivations(np.ones((1, 256), np.float32))  # (1, 256)
    for kind in sorted(kinds):
        code = KINDS[kind]
        raw = np.zeros((1, 256 // BLOCK_WEIGHTS[code] * BLOCK_BYTES[code]), np.uint8)  # (1, bytes)
        quant_matmul(x, kind, raw)
    log.info("integer block matmul: numba integer kernel for this CPU's vector unit, types %s", ",".join(sorted(kinds)))
