"""Integer matmuls over interleaved 32-weight blocks (interleaved_blocks.py: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): x (N, C)
times the matrix (R, C) transposed, with x quantized per 16 columns to two int8 bytes, a high one and the remainder
in 256ths (int8_spans.quantize_span_fine; llama.cpp's Q8_0 and Q8_1 take one byte per 32 columns: that scheme here
left SmolLM2 Q4_1's largest logit error at 1.35, one byte per 16 at 1.37, against llama.cpp's 0.96), and every
product of codes and activations summed in integers. One `vpdpbusd` (simd_wide.wdot4) multiplies four codes of
each of sixteen weight rows into one x row's four activations; four sum half a block's products with one byte, and
256 * high + low joins the two. On the avx2 path the same integers come from `vpmaddubsw` and `vpmaddwd`, on the
generic path from portable LLVM vector code (simd_wide.py).

THE REDUCTION (every step width computes exactly this, so a row's result never depends on the rest of its step):

    activations, per x row k and half block j (16 columns): q, low and dx[k, j] (dx / 256) by int8_spans'
      quantize_span_fine over its columns; v = 256 q + low; S[k, j] = the sum of its v;
    per weight row r and x row k, over the blocks b = 0, 1, .. in order, and their halves j = 2b, 2b + 1:
      I[j] = sum over half j's columns of code * v - zero * S[k, j]      (int32: exact in any order, |I| < 2**27)
      acc = fma(float(I[2b]), float32(scale[r, b] * dx[k, 2b]), acc)
      acc = fma(float(I[2b + 1]), float32(scale[r, b] * dx[k, 2b + 1]), acc)
      macc = fma(offset[r, b], float32(float32(S[k, 2b] * dx[k, 2b]) + float32(S[k, 2b + 1] * dx[k, 2b + 1])), macc)
            (only where the matrix has offsets)
    out[k, r] = acc + macc  (macc = 0 without offsets)

`reference_matmul` is the same arithmetic in numpy. A parallel task takes a run of row groups (the threads take the
tasks of a launch from one queue: numba_runtime.guided_bounds) and, group by group, carries up to X_ROWS x rows over
each block in turn, the block's codes held in registers for all of them; the same loop serves one row (decode: each
weight byte is read once) and hundreds (prefill). Launches hold numba_runtime.launch_lock.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from worker.engine.kernels.int8_spans import fma32, quantize_span_fine, reference_spans_fine
from worker.engine.kernels.numba_runtime import aligned_floats, guided_bounds, launch_lock, take_next
from worker.engine.kernels.simd_int import KERNEL_CACHE, prefetch_run
from worker.engine.kernels.simd_wide import (
    wadd,
    wdot4,
    wdot4_bytes,
    wfadd,
    wfbroadcast,
    wfload,
    wfloat,
    wfma,
    wfmul,
    wfstore,
    wfzero,
    whigh4,
    wload_codes,
    wlow4,
    wquad_splat,
    wshl,
    wsplat,
    wsub,
    wzero,
)
from worker.engine.weights.interleaved_blocks import TILE_ROWS, VECTOR_BYTES, InterleavedBlocks
from worker.engine.weights.quant_blocks import LEGACY_BLOCK
from worker.engine.weights.read_only import read_only

X_ROWS = 32  # x rows a task carries over a block (their chains, 2 * 32 * 16 float32, stay in L1)
PREFETCH_BYTES = 2048  # how far ahead every pass asks for the codes (prefetch_ahead)
ACT_SPAN = 16  # activation columns per int8 scale (two per block)
PARALLEL_QUANTIZE = 16384  # activations from which quantizing splits rows across threads (a launch costs ~10 us)
_NO_OFFSET = read_only(np.zeros((0, 0, TILE_ROWS), np.float32))  # the offset table of a matrix without one


@njit(inline="always", cache=KERNEL_CACHE)
def _quantize_row(x, q, low, dx, sums, k):  # pragma: no cover (compiled)
    """q, low, dx and S (the module docstring's) of row k of x (N, C)."""
    for j in range(x.shape[1] // ACT_SPAN):
        dx[k, j] = quantize_span_fine(x, k, j * ACT_SPAN, (j + 1) * ACT_SPAN, q, low)
        total = np.int32(0)
        for c in range(j * ACT_SPAN, (j + 1) * ACT_SPAN):
            total += np.int32(256) * np.int32(q[k, c]) + np.int32(low[k, c])
        sums[k, j] = total


@njit(nogil=True, cache=True)
def _quantize(x, q, low, dx, sums):  # pragma: no cover (compiled)
    """_quantize_row for every row of x, in this thread."""
    for k in range(x.shape[0]):
        _quantize_row(x, q, low, dx, sums, k)


@njit(parallel=True, nogil=True, cache=True)
def _quantize_parallel(x, q, low, dx, sums):  # pragma: no cover (compiled)
    """_quantize_row for every row of x, rows across the kernel threads."""
    for k in prange(x.shape[0]):
        _quantize_row(x, q, low, dx, sums, k)


class FineRows(NamedTuple):
    """x quantized for the kernel (the module docstring's names)."""

    q: np.ndarray  # (N, C) int8: the high byte
    low: np.ndarray  # (N, C) int8: the remainder in 256ths
    dx: np.ndarray  # (N, C/16) float32: the span's scale / 256
    sums: np.ndarray  # (N, C/16) int32: S


def quantize_halves(x: np.ndarray) -> FineRows:
    """x (N, C) as two int8 bytes per activation with their scales and sums (FineRows)."""
    n_rows, cols = x.shape
    rows = FineRows(np.empty((n_rows, cols), np.int8), np.empty((n_rows, cols), np.int8),
                    np.empty((n_rows, cols // ACT_SPAN), np.float32), np.empty((n_rows, cols // ACT_SPAN), np.int32))
    x = np.ascontiguousarray(x, dtype=np.float32)
    if n_rows * cols < PARALLEL_QUANTIZE:
        _quantize(x, *rows)
    else:
        with launch_lock:
            _quantize_parallel(x, *rows)
    return rows


@njit(inline="always", cache=KERNEL_CACHE)
def prefetch_ahead(flat_codes, at, size):  # pragma: no cover (compiled)
    """Ask for the `size` code bytes PREFETCH_BYTES past `at`, at any step width. Wide passes (prefill, wide decode)
    leave the hardware prefetcher behind (interleaved_k_matmul._prefetch_codes). One to four rows were thought bound
    by memory alone and did not ask until a Xeon (2026-11-29; its kernels read 75% of the bandwidth probe at one row)
    measured them: a one-row decode step of the gpt-oss-20b-half twin (Q8_0 attention and output, MXFP4 experts)
    118 ms against 136 (medians of 4 alternated runs), SmolLM2's (Q4_1, Q8_0) matmuls 8.1-8.2 ms against 9.7-10.2.
    The K-quant one-row paths (interleaved_k_single) stay without: there asking made the synthetic 1B's step
    10-18% longer on the same Xeon, as on an earlier one."""
    prefetch_run(flat_codes, at + PREFETCH_BYTES, size)


@njit(inline="always", cache=KERNEL_CACHE)
def half_sum(c0, c1, c2, c3, flat_q, flat_low, qa, full_bytes):  # pragma: no cover (compiled)
    """Lane r: the sum of 16 products of row r's codes (c_i: columns 4i..4i+3 of the half) and the activations
    256 q + low at qa..qa+15 (four vpdpbusd for each byte). `full_bytes`: codes may pass 127 (simd_wide.wdot4_bytes)."""
    if full_bytes:
        high = wdot4_bytes(wzero(), c0, wquad_splat(flat_q, qa))  # (16,) int32
        low = wdot4_bytes(wzero(), c0, wquad_splat(flat_low, qa))  # (16,) int32
        high = wdot4_bytes(high, c1, wquad_splat(flat_q, qa + 4))
        low = wdot4_bytes(low, c1, wquad_splat(flat_low, qa + 4))
        high = wdot4_bytes(high, c2, wquad_splat(flat_q, qa + 8))
        low = wdot4_bytes(low, c2, wquad_splat(flat_low, qa + 8))
        high = wdot4_bytes(high, c3, wquad_splat(flat_q, qa + 12))
        low = wdot4_bytes(low, c3, wquad_splat(flat_low, qa + 12))
    else:
        high = wdot4(wzero(), c0, wquad_splat(flat_q, qa))  # (16,) int32
        low = wdot4(wzero(), c0, wquad_splat(flat_low, qa))  # (16,) int32
        high = wdot4(high, c1, wquad_splat(flat_q, qa + 4))
        low = wdot4(low, c1, wquad_splat(flat_low, qa + 4))
        high = wdot4(high, c2, wquad_splat(flat_q, qa + 8))
        low = wdot4(low, c2, wquad_splat(flat_low, qa + 8))
        high = wdot4(high, c3, wquad_splat(flat_q, qa + 12))
        low = wdot4(low, c3, wquad_splat(flat_low, qa + 12))
    return wadd(wshl(high, wsplat(8)), low)


@njit(inline="always", cache=KERNEL_CACHE)
def _group(flat_codes, flat_scale, flat_offset, has_offset, zero, blocks, vectors, g, flat_q, flat_low, dx, sums,
           n_rows, cols, acc, macc, flat_out, width):  # pragma: no cover (compiled)
    """Weight row group g's outputs for every x row, X_ROWS at a time (acc, macc: the chains' scratch)."""
    full_bytes = vectors == 8  # one byte a code: Q8_0's reach 255
    for x0 in range(0, n_rows, X_ROWS):
        n = min(X_ROWS, n_rows - x0)
        for i in range(n):
            wfstore(acc, i * TILE_ROWS, wfzero())
            wfstore(macc, i * TILE_ROWS, wfzero())
        for b in range(blocks):
            at = (g * blocks + b) * vectors * VECTOR_BYTES
            prefetch_ahead(flat_codes, at, vectors * VECTOR_BYTES)
            if vectors == 4:
                v0, v1 = wload_codes(flat_codes, at), wload_codes(flat_codes, at + 64)  # (64,) each
                v2, v3 = wload_codes(flat_codes, at + 128), wload_codes(flat_codes, at + 192)  # (64,) each
                c0, c1, c2, c3 = wlow4(v0), whigh4(v0), wlow4(v1), whigh4(v1)  # (64,) each
                c4, c5, c6, c7 = wlow4(v2), whigh4(v2), wlow4(v3), whigh4(v3)  # (64,) each
            else:
                c0, c1 = wload_codes(flat_codes, at), wload_codes(flat_codes, at + 64)  # (64,) each
                c2, c3 = wload_codes(flat_codes, at + 128), wload_codes(flat_codes, at + 192)  # (64,) each
                c4, c5 = wload_codes(flat_codes, at + 256), wload_codes(flat_codes, at + 320)  # (64,) each
                c6, c7 = wload_codes(flat_codes, at + 384), wload_codes(flat_codes, at + 448)  # (64,) each
            table = (g * blocks + b) * TILE_ROWS
            s = wfload(flat_scale, table)  # (16,) the block's scale of each row
            for i in range(n):
                k = x0 + i
                qa = k * cols + b * LEGACY_BLOCK
                low = half_sum(c0, c1, c2, c3, flat_q, flat_low, qa, full_bytes)  # (16,) int32: columns 0..15
                high = half_sum(c4, c5, c6, c7, flat_q, flat_low, qa + ACT_SPAN, full_bytes)  # (16,): 16..31
                if zero != 0:
                    low = wsub(low, wsplat(zero * sums[k, 2 * b]))
                    high = wsub(high, wsplat(zero * sums[k, 2 * b + 1]))
                a = wfma(wfloat(low), wfmul(s, wfbroadcast(dx[k, 2 * b])), wfload(acc, i * TILE_ROWS))  # (16,)
                wfstore(acc, i * TILE_ROWS, wfma(wfloat(high), wfmul(s, wfbroadcast(dx[k, 2 * b + 1])), a))
            if has_offset:
                m = wfload(flat_offset, table)  # (16,) the block's offset of each row
                for i in range(n):
                    k = x0 + i
                    weight = (np.float32(sums[k, 2 * b]) * dx[k, 2 * b]
                              + np.float32(sums[k, 2 * b + 1]) * dx[k, 2 * b + 1])  # S * dx over the block
                    wfstore(macc, i * TILE_ROWS, wfma(m, wfbroadcast(weight), wfload(macc, i * TILE_ROWS)))
        for i in range(n):
            total = wfadd(wfload(acc, i * TILE_ROWS), wfload(macc, i * TILE_ROWS))  # (16,)
            wfstore(flat_out, (x0 + i) * width + g * TILE_ROWS, total)


@njit(parallel=True, nogil=True, cache=KERNEL_CACHE)
def _matmul(codes, scale, offset, zero, q, low, dx, sums, out, threads):  # pragma: no cover (compiled)
    """out (N, 16 G) = the module docstring's reduction of x's (q, low, dx, sums) against the interleaved matrix;
    tasks take runs of row groups from a queue the `threads` share."""
    groups, blocks, vectors = codes.shape[0], codes.shape[1], codes.shape[2]
    n_rows, cols = q.shape
    width = out.shape[1]
    flat_codes, flat_scale, flat_offset = codes.reshape(-1), scale.reshape(-1), offset.reshape(-1)
    flat_q, flat_low, flat_out = q.reshape(-1), low.reshape(-1), out.reshape(-1)
    has_offset = offset.shape[0] > 0
    bounds = guided_bounds(groups, threads)  # (tasks + 1,)
    queue = np.zeros(1, np.int64)  # the next task not taken
    for _ in prange(min(threads, len(bounds) - 1)):
        acc = aligned_floats(X_ROWS * TILE_ROWS)  # (X_ROWS, 16) chains
        macc = aligned_floats(X_ROWS * TILE_ROWS)  # (X_ROWS, 16) chains of the offsets
        task = take_next(queue)
        while task < len(bounds) - 1:
            for g in range(bounds[task], bounds[task + 1]):
                _group(flat_codes, flat_scale, flat_offset, has_offset, zero, blocks, vectors, g, flat_q, flat_low,
                       dx, sums, n_rows, cols, acc, macc, flat_out, width)
            task = take_next(queue)


def interleaved_matmul(x: np.ndarray, blocks: InterleavedBlocks) -> np.ndarray:
    """x (N, C) times the interleaved matrix (R, C) transposed: (N, R), row-major."""
    n_rows, cols = x.shape
    if blocks.shape[1] != cols:
        raise ValueError(f"interleaved matrix {blocks.shape} does not fit x {x.shape}")
    rows = quantize_halves(x)
    groups = blocks.codes.shape[0]
    out = np.empty((n_rows, groups * TILE_ROWS), np.float32)  # (N, 16 G)
    offset = _NO_OFFSET if blocks.offset is None else blocks.offset
    with launch_lock:
        _matmul(blocks.codes, blocks.scale, offset, blocks.zero, *rows, out, numba.get_num_threads())
    return out if groups * TILE_ROWS == blocks.out else np.ascontiguousarray(out[:, : blocks.out])  # (N, R)


def reference_matmul(x: np.ndarray, blocks: InterleavedBlocks) -> np.ndarray:
    """interleaved_matmul's arithmetic in numpy, step by step: (N, R)."""
    q, low, dx = reference_spans_fine(x, ACT_SPAN)  # (N, C), (N, C), (N, 2B)
    n_rows, cols = q.shape
    halves = cols // ACT_SPAN
    q_halves = (256 * q.astype(np.int64) + low).reshape(n_rows, halves, ACT_SPAN)  # (N, 2B, 16) v
    sums = q_halves.sum(axis=2)  # (N, 2B)
    codes = blocks.code_rows().reshape(blocks.out, halves, ACT_SPAN).astype(np.int64)  # (R, 2B, 16)
    products = np.einsum("rjc,kjc->rkj", codes, q_halves) - blocks.zero * sums[None, :, :]  # (R, N, 2B)
    scale = np.repeat(blocks.row_table(blocks.scale), 2, axis=1)  # (R, 2B): a block's scale for both halves
    factor = (scale[:, None, :] * dx[None, :, :]).astype(np.float32)  # (R, N, 2B)
    part = (sums.astype(np.float32) * dx).astype(np.float32)  # (N, 2B)
    weight = (part[:, 0::2] + part[:, 1::2]).astype(np.float32)  # (N, B)
    acc = np.zeros((blocks.out, n_rows), np.float32)  # (R, N)
    macc = np.zeros((blocks.out, n_rows), np.float32)  # (R, N)
    offset = None if blocks.offset is None else blocks.row_table(blocks.offset)  # (R, B)
    for j in range(halves):
        acc = fma32(products[:, :, j].astype(np.float32), factor[:, :, j], acc)
        if offset is not None and j % 2:
            macc = fma32(np.repeat(offset[:, j // 2, None], n_rows, axis=1),
                         np.repeat(weight[None, :, j // 2], blocks.out, 0), macc)
    return np.ascontiguousarray((acc + macc).T)  # (N, R)


def warm() -> None:
    """Compile (or load from numba's cache) the kernel with and without offsets (a matrix's arrays are read-only
    however it was made)."""
    for offset in (None, np.zeros((1, 1, TILE_ROWS), np.float32)):
        blocks = InterleavedBlocks(np.zeros((1, 1, 4, VECTOR_BYTES), np.uint8), np.zeros((1, 1, TILE_ROWS), np.float32),
                                   offset, 0 if offset is not None else 8, TILE_ROWS)
        interleaved_matmul(np.zeros((1, LEGACY_BLOCK), np.float32), blocks)
