"""x quantized for the K-quant kernels (interleaved_k_matmul.py): int8 codes with a float32 scale per 64 columns
(int8_spans.quantize_span; llama.cpp's Q8_K has one per 256: the finer one keeps our error inside llama.cpp's), and the
sums the kernels' integer reduction needs (S32 per 32 columns, -32 S8 per 8: that module's docstring)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from worker.engine.kernels.int8_spans import quantize_span, reference_spans
from worker.engine.kernels.numba_runtime import launch_lock
from worker.engine.kernels.simd_int import KERNEL_CACHE

ACT_BLOCK = 64  # activation columns per int8 scale (four per super-block)
PARALLEL_QUANTIZE = 16384  # activations from which quantizing splits rows across threads (a launch costs ~10 us)


@njit(inline="always", cache=KERNEL_CACHE)
def _quantize_row(x, q, dx, sums32, offsets, k):  # pragma: no cover (compiled)
    """q, dx, S32 and -32 S8 (the module docstring's) of row k of x (N, C)."""
    for h in range(x.shape[1] // ACT_BLOCK):
        dx[k, h] = quantize_span(x, k, h * ACT_BLOCK, (h + 1) * ACT_BLOCK, q)
    for j in range(x.shape[1] // 32):
        block = np.int32(0)
        for e in range(4):
            total = np.int32(0)
            for c in range(32 * j + 8 * e, 32 * j + 8 * e + 8):
                total += np.int32(q[k, c])
            offsets[k, 4 * j + e] = np.int32(-32) * total
            block += total
        sums32[k, j] = np.int16(block)


@njit(nogil=True, cache=True)
def quantize_into(x, q, dx, sums32, offsets):  # pragma: no cover (compiled)
    """Every row of x (N, C) into q, dx, S32 and -32 S8 (Int8Rows' arrays), in this thread (also called from compiled
    code: interleaved_k_matmul quantizes a few rows inside its launch)."""
    for k in range(x.shape[0]):
        _quantize_row(x, q, dx, sums32, offsets, k)


@njit(parallel=True, nogil=True, cache=True)
def _quantize_parallel(x, q, dx, sums32, offsets):  # pragma: no cover (compiled)
    """_quantize_row for every row of x, rows across the kernel threads."""
    for k in prange(x.shape[0]):
        _quantize_row(x, q, dx, sums32, offsets, k)


class Int8Rows(NamedTuple):
    """x quantized for the kernel (the module docstring's names)."""

    q: np.ndarray  # (N, C) int8
    dx: np.ndarray  # (N, C/64) float32
    sums32: np.ndarray  # (N, C/32) int16: S32
    offsets: np.ndarray  # (N, C/8) int32: -32 S8


def quantize_rows(x: np.ndarray) -> Int8Rows:
    """x (N, C) float32 as int8 codes with their scales and group sums (Int8Rows)."""
    n_rows, cols = x.shape
    rows = Int8Rows(np.empty((n_rows, cols), np.int8), np.empty((n_rows, cols // ACT_BLOCK), np.float32),
                    np.empty((n_rows, cols // 32), np.int16), np.empty((n_rows, cols // 8), np.int32))
    x = np.ascontiguousarray(x, dtype=np.float32)
    if n_rows * cols < PARALLEL_QUANTIZE:
        quantize_into(x, *rows)
    else:
        with launch_lock:
            _quantize_parallel(x, *rows)
    return rows


def reference_quantize(x: np.ndarray) -> Int8Rows:
    """quantize_rows in numpy."""
    q, dx = reference_spans(x, ACT_BLOCK)  # (N, C), (N, C/64)
    n_rows, cols = q.shape
    sums8 = q.reshape(n_rows, cols // 8, 8).sum(axis=2, dtype=np.int32)  # (N, C/8)
    sums32 = q.reshape(n_rows, cols // 32, 32).sum(axis=2, dtype=np.int32).astype(np.int16)  # (N, C/32)
    return Int8Rows(q, dx, sums32, -32 * sums8)
