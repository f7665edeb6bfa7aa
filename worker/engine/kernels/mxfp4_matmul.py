"""Integer matmuls over interleaved MXFP4 blocks (interleaved_mxfp4.py): x (N, C) times the matrix (R, C) transposed,
with x quantized per 16 columns to two int8 bytes as for the other 32-weight kinds (interleaved_matmul.quantize_halves:
a high byte q and the remainder `low` in 256ths), and every product of weight values and activations summed in
integers. A code's value comes from a sixteen-entry int8 table (simd_mxfp4.wlookup16: one `vpshufb` per 64 codes)
holding KVALUES + 12 (0..24: `vpdpbusd` takes unsigned bytes), and 12 times the activations' sum comes off after.
The block's scale is its E8M0 exponent decoded in registers (a power of two: exact), times the row's scale.

THE REDUCTION (every step width computes exactly this, so a row's result never depends on the rest of its step):

    activations, per x row k and half block j (16 columns): q, low and dx[k, j] (dx / 256) by int8_spans'
      quantize_span_fine over its columns; v = 256 q + low; S[k, j] = the sum of its v;
    per weight row r: s[r, b] = float32(E8M0_HALF(e[r, b]) * row_scale[r]);
    per weight row r and x row k, over the blocks b = 0, 1, .. in order, and their halves j = 2b, 2b + 1:
      I[j] = sum over half j's columns of (KVALUES[code] + 12) * v - 12 * S[k, j]
           = sum over half j's columns of KVALUES[code] * v      (int32, exact in any order: |I| < 2**23)
      acc = fma(float(I[2b]), float32(s[r, b] * dx[k, 2b]), acc)
      acc = fma(float(I[2b + 1]), float32(s[r, b] * dx[k, 2b + 1]), acc)
    out[k, r] = acc

`reference_matmul` is the same arithmetic in numpy. A parallel task takes a run of row groups (the threads take the
tasks of a launch from one queue: numba_runtime.guided_bounds; stacked experts: of (expert, group) items, each with
its own run of x rows) and, group by group, carries up to X_ROWS x rows over each block in turn, the block's values
held in registers for all of them; the same loop serves one row (decode: each weight byte is read once) and hundreds
(prefill). Launches hold numba_runtime.launch_lock.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from worker.engine.kernels.int8_spans import fma32, reference_spans_fine
from worker.engine.kernels.interleaved_matmul import (
    ACT_SPAN,
    X_ROWS,
    half_sum,
    prefetch_ahead,
    quantize_halves,
)
from worker.engine.kernels.numba_runtime import aligned_floats, guided_bounds, launch_lock, take_next
from worker.engine.kernels.simd_int import KERNEL_CACHE
from worker.engine.kernels.simd_mxfp4 import wexp_half, wlookup16
from worker.engine.kernels.simd_wide import (
    wfbroadcast,
    wfload,
    wfloat,
    wfma,
    wfmul,
    wfstore,
    wfzero,
    whigh4,
    wload_codes,
    wload_widened,
    wlow4,
    wsplat,
    wsub,
)
from worker.engine.weights.interleaved_mxfp4 import (
    TILE_ROWS,
    VECTOR_BYTES,
    VECTORS,
    InterleavedMXFP4,
    interleave_mxfp4,
)
from worker.engine.weights.mxfp4_blocks import KVALUES, MXFP4_BLOCK, MXFP4Blocks

ZERO = 12  # added to every value by the table (unsigned bytes for vpdpbusd), taken off with the activations' sums
LOOKUP = np.tile((KVALUES.astype(np.int16) + ZERO).astype(np.uint8), 4)  # (64,) the table in each 128-bit lane


@njit(inline="always", cache=KERNEL_CACHE)
def _group(flat_codes, flat_exponents, flat_row_scale, table, blocks, g, flat_q, flat_low, dx, sums, first, last,
           cols, acc, flat_out, width, column):  # pragma: no cover (compiled)
    """Weight row group g's outputs for x rows first .. last - 1, X_ROWS at a time, into out's columns from 16
    `column` (acc: the chains' scratch)."""
    row_scale = wfload(flat_row_scale, g * TILE_ROWS)  # (16,)
    for x0 in range(first, last, X_ROWS):
        n = min(X_ROWS, last - x0)
        for i in range(n):
            wfstore(acc, i * TILE_ROWS, wfzero())
        for b in range(blocks):
            at = (g * blocks + b) * VECTORS * VECTOR_BYTES
            prefetch_ahead(flat_codes, at, VECTORS * VECTOR_BYTES)  # at every width (its docstring: why)
            v0, v1 = wload_codes(flat_codes, at), wload_codes(flat_codes, at + 64)  # (64,) each
            v2, v3 = wload_codes(flat_codes, at + 128), wload_codes(flat_codes, at + 192)  # (64,) each
            l0, l1 = wlookup16(table, wlow4(v0)), wlookup16(table, wlow4(v1))  # (64,) columns 0..7, + 12
            l2, l3 = wlookup16(table, wlow4(v2)), wlookup16(table, wlow4(v3))  # (64,) columns 8..15
            h0, h1 = wlookup16(table, whigh4(v0)), wlookup16(table, whigh4(v1))  # (64,) columns 16..23
            h2, h3 = wlookup16(table, whigh4(v2)), wlookup16(table, whigh4(v3))  # (64,) columns 24..31
            exponents = wload_widened(flat_exponents, (g * blocks + b) * TILE_ROWS)  # (16,) int32
            s = wfmul(wexp_half(exponents), row_scale)  # (16,) the block's scale of each row
            for i in range(n):
                k = x0 + i
                qa = k * cols + b * MXFP4_BLOCK
                first = half_sum(l0, l1, l2, l3, flat_q, flat_low, qa, False)  # (16,) int32: columns 0..15
                second = half_sum(h0, h1, h2, h3, flat_q, flat_low, qa + ACT_SPAN, False)  # (16,): 16..31
                first = wsub(first, wsplat(ZERO * sums[k, 2 * b]))
                second = wsub(second, wsplat(ZERO * sums[k, 2 * b + 1]))
                a = wfma(wfloat(first), wfmul(s, wfbroadcast(dx[k, 2 * b])), wfload(acc, i * TILE_ROWS))  # (16,)
                wfstore(acc, i * TILE_ROWS, wfma(wfloat(second), wfmul(s, wfbroadcast(dx[k, 2 * b + 1])), a))
        for i in range(n):
            wfstore(flat_out, (x0 + i) * width + column * TILE_ROWS, wfload(acc, i * TILE_ROWS))


@njit(parallel=True, nogil=True, cache=KERNEL_CACHE)
def _matmul(codes, exponents, row_scale, lookup, q, low, dx, sums, parts, starts, span, out,
            threads):  # pragma: no cover
    """out[k, :16 span] for x rows starts[i] .. starts[i + 1] - 1 against the `span` row groups from parts[i] * span
    on (a dense matrix: one part, 0; stacked experts: each used expert's rows), the module docstring's reduction of
    x's (q, low, dx, sums). Tasks take runs of (part, group) items from a queue the `threads` share."""
    blocks = codes.shape[1]
    cols = q.shape[1]
    width = out.shape[1]
    flat_codes, flat_exponents, flat_row_scale = codes.reshape(-1), exponents.reshape(-1), row_scale.reshape(-1)
    flat_q, flat_low, flat_out = q.reshape(-1), low.reshape(-1), out.reshape(-1)
    bounds = guided_bounds(len(parts) * span, threads)  # (tasks + 1,)
    queue = np.zeros(1, np.int64)  # the next task not taken
    for _ in prange(min(threads, len(bounds) - 1)):
        acc = aligned_floats(X_ROWS * TILE_ROWS)  # (X_ROWS, 16) chains
        table = wload_codes(lookup, 0)  # (64,) the value table in each 128-bit lane
        task = take_next(queue)
        while task < len(bounds) - 1:
            for item in range(bounds[task], bounds[task + 1]):
                part, local = item // span, item % span
                _group(flat_codes, flat_exponents, flat_row_scale, table, blocks, parts[part] * span + local, flat_q,
                       flat_low, dx, sums, starts[part], starts[part + 1], cols, acc, flat_out, width, local)
            task = take_next(queue)


def mxfp4_matmul(x: np.ndarray, blocks: InterleavedMXFP4) -> np.ndarray:
    """x (N, C) times the interleaved MXFP4 matrix (R, C) transposed: (N, R), row-major."""
    n_rows, cols = x.shape
    if blocks.shape[1] != cols:
        raise ValueError(f"MXFP4 matrix {blocks.shape} does not fit x {x.shape}")
    rows = quantize_halves(x)
    groups = blocks.codes.shape[0]
    out = np.empty((n_rows, groups * TILE_ROWS), np.float32)  # (N, 16 G)
    with launch_lock:
        _matmul(blocks.codes, blocks.exponents, blocks.row_scale, LOOKUP, *rows, _DENSE,
                np.array([0, n_rows], np.int64), groups, out, numba.get_num_threads())
    return out if groups * TILE_ROWS == blocks.out else np.ascontiguousarray(out[:, : blocks.out])  # (N, R)


_DENSE = np.zeros(1, np.int64)  # a dense matrix is one part: rows from 0


def mxfp4_grouped(rows: tuple[np.ndarray, ...], blocks: InterleavedMXFP4, parts: np.ndarray, starts: np.ndarray,
                  part_rows: int) -> np.ndarray:
    """Stacked experts: x rows starts[i] .. starts[i + 1] - 1 (quantize_halves' arrays) times the (part_rows, C)
    block of rows from parts[i] * part_rows on, transposed, each expert's codes read once for all of its rows:
    (P, part_rows)."""
    if part_rows % TILE_ROWS:
        raise ValueError(f"experts of {part_rows} rows are not whole groups of {TILE_ROWS}")
    out = np.empty((rows[0].shape[0], part_rows), np.float32)  # (P, part_rows)
    with launch_lock:
        _matmul(blocks.codes, blocks.exponents, blocks.row_scale, LOOKUP, *rows, np.ascontiguousarray(parts, np.int64),
                np.ascontiguousarray(starts, np.int64), part_rows // TILE_ROWS, out, numba.get_num_threads())
    return out


def reference_matmul(x: np.ndarray, blocks: InterleavedMXFP4) -> np.ndarray:
    """mxfp4_matmul's arithmetic in numpy, step by step: (N, R)."""
    q, low, dx = reference_spans_fine(x, ACT_SPAN)  # (N, C), (N, C), (N, 2B)
    n_rows, cols = q.shape
    halves = cols // ACT_SPAN
    v = (256 * q.astype(np.int64) + low).reshape(n_rows, halves, ACT_SPAN)  # (N, 2B, 16)
    values = KVALUES[blocks.code_rows()].astype(np.int64).reshape(blocks.out, halves, ACT_SPAN)  # (R, 2B, 16)
    products = np.einsum("rjc,kjc->rkj", values, v)  # (R, N, 2B): I
    scale = np.repeat(blocks.block_scale(), 2, axis=1)  # (R, 2B): a block's scale for both halves
    factor = (scale[:, None, :] * dx[None, :, :]).astype(np.float32)  # (R, N, 2B)
    acc = np.zeros((blocks.out, n_rows), np.float32)  # (R, N)
    for j in range(halves):
        acc = fma32(products[:, :, j].astype(np.float32), factor[:, :, j], acc)
    return np.ascontiguousarray(acc.T)  # (N, R)


def warm() -> None:
    """Compile (or load from numba's cache) the kernel (a matrix's arrays are read-only however it was made)."""
    plain = MXFP4Blocks(np.zeros((TILE_ROWS, MXFP4_BLOCK // 2), np.uint8), np.zeros((TILE_ROWS, 1), np.uint8),
                        np.ones(TILE_ROWS, np.float32))
    mxfp4_matmul(np.zeros((1, MXFP4_BLOCK), np.float32), interleave_mxfp4(plain))
