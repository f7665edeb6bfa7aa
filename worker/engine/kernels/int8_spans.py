"""Activations quantized to int8 a span of columns at a time, the one rule every integer kernel's x goes through:
over a span, dx = max|x| / 127 and q = rint(x * (127 / max|x|)) (q = 0 and dx = 0 when the span is all zeros), so
|q| <= 127 and x ~ q * dx. interleaved_k_matmul.py takes spans of 64 columns. interleaved_matmul.py takes spans
of 16 and a second byte: the remainder in 256ths of dx, rint((x / dx - q) * 256) clipped to 127, so that
x ~ (256 q + low) * dx / 256, sixteen bits of activation carried by two int8 products.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from worker.engine.kernels.simd_int import KERNEL_CACHE


@njit(inline="always", cache=KERNEL_CACHE, fastmath={"nnan", "ninf", "nsz"})
def _span_amax(x, k, first, last):  # pragma: no cover (compiled)
    """max |x[k, first:last]| (a span of a multiple of 8 columns) over eight independent chains: one chain is a
    run of dependent maxima LLVM does not vectorise (a maximum is exact in any order)."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(0.0)
    for c in range(first, last, 8):
        m0, m1 = max(m0, abs(x[k, c])), max(m1, abs(x[k, c + 1]))
        m2, m3 = max(m2, abs(x[k, c + 2])), max(m3, abs(x[k, c + 3]))
        m4, m5 = max(m4, abs(x[k, c + 4])), max(m5, abs(x[k, c + 5]))
        m6, m7 = max(m6, abs(x[k, c + 6])), max(m7, abs(x[k, c + 7]))
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@njit(inline="always", cache=KERNEL_CACHE, fastmath={"nnan", "ninf", "nsz"})
def quantize_span(x, k, first, last, q):  # pragma: no cover (compiled)
    """q[k, first:last] from x[k, first:last] (the module docstring's rule); returns the span's dx. (The fastmath
    flags let LLVM use vector maxima and conversions; they change no rounding: no reassociation, no contraction.)"""
    amax = _span_amax(x, k, first, last)
    inverse = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
    for c in range(first, last):
        q[k, c] = np.int8(np.rint(x[k, c] * inverse))
    return amax / np.float32(127.0)


@njit(inline="always", cache=KERNEL_CACHE, fastmath={"nnan", "ninf", "nsz"})
def quantize_span_fine(x, k, first, last, q, low):  # pragma: no cover (compiled)
    """q[k, first:last] as quantize_span's, and low[k, first:last] the remainders in 256ths (the module
    docstring's); returns the span's dx / 256."""
    amax = _span_amax(x, k, first, last)
    inverse = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
    for c in range(first, last):
        units = x[k, c] * inverse
        whole = np.rint(units)
        q[k, c] = np.int8(whole)
        low[k, c] = np.int8(min(np.rint((units - whole) * np.float32(256.0)), np.float32(127.0)))
    return amax / np.float32(127.0) / np.float32(256.0)


def reference_spans(x: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_span over every span of x (N, C) in numpy: q (N, C) int8 and dx (N, C/span) float32."""
    x = np.asarray(x, np.float32)
    n_rows, cols = x.shape
    spans = x.reshape(n_rows, cols // span, span)  # (N, H, span)
    amax = np.abs(spans).max(axis=2)  # (N, H)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)  # (N, H)
    dx = (amax / np.float32(127.0)).astype(np.float32)  # (N, H)
    q = np.rint((spans * inverse[:, :, None]).astype(np.float32)).astype(np.int8).reshape(n_rows, cols)  # (N, C)
    return q, dx


def reference_spans_fine(x: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_span_fine over every span of x (N, C) in numpy: q, low (N, C) int8 and dx / 256 (N, C/span)."""
    x = np.asarray(x, np.float32)
    n_rows, cols = x.shape
    spans = x.reshape(n_rows, cols // span, span)  # (N, H, span)
    amax = np.abs(spans).max(axis=2)  # (N, H)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)  # (N, H)
    units = (spans * inverse[:, :, None]).astype(np.float32)  # (N, H, span)
    whole = np.rint(units)  # (N, H, span)
    low = np.minimum(np.rint(((units - whole).astype(np.float32) * np.float32(256.0)).astype(np.float32)), 127)
    dx = ((amax / np.float32(127.0)).astype(np.float32) / np.float32(256.0)).astype(np.float32)  # (N, H)
    return whole.astype(np.int8).reshape(n_rows, cols), low.astype(np.int8).reshape(n_rows, cols), dx


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once (the float64 product of two float32 is exact), as the kernels' FMAs."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
