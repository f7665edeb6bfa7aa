"""Compiled CPU kernels (numba) for an encoder's (BERT's) attention, residual LayerNorm and GELU.

numpy spent about as long on these as on the encoder's matmuls at MiniLM's size: bidirectional attention over
short texts is thousands of tiny (T, T) products that numpy's stacked matmul runs one by one after gathering and
padding the texts, and the residual add, LayerNorm and bias + GELU were eight to ten passes over memory each.
Here each is one pass across the kernel threads (numba_runtime.py's threading set-up and launch lock):
- `attend_texts`: one task per (text, head) reads its queries, keys and values straight out of the fused QKV
  projection as BLAS leaves it (the transposed (3*H*Dh, N) block, bias added on the fly), softmaxes each row of
  scores in registers-sized buffers and writes its (T, Dh) slice of the (N, H*Dh) output; no padding.
- `add_layer_norm`: x <- LayerNorm(x + y + bias) in place, y the (N, D) matmul output in either memory order
  (read in blocks of 16 rows, so a column-major y is read a cache line at a time).
- `bias_gelu`: h <- GELU(h + bias) in place on the (F, N) up-projection as BLAS leaves it (bias per row), tanh
  written x·σ(2u) = x / (1 + e^-2u) (the same function as ggml's 0.5·x·(1 + tanh u), without its cancellation)
  with the eight-lane exp (simd.py).
numba's on-disk cache is keyed on this file; see simd.py about changing an intrinsic.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from worker.engine.kernels.layer_kernels import launch_lock
from worker.engine.kernels.simd import LANES, vadd, vbroadcast, vdiv, vexp, vload, vmul, vstore

ROW_BLOCK = 16  # rows of one add_layer_norm task (a cache line of a column-major y)
GELU_CHUNK = 512  # columns of one bias_gelu task
SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _attend_texts(qkv_t, bias, starts, n_heads, head_dim, out):  # pragma: no cover (compiled)
    """out[r, h*Dh:(h+1)*Dh] = softmax(q_r · K_text^T) V_text for every row r of every text, per head h."""
    n_texts = starts.shape[0] - 1
    inner = n_heads * head_dim
    for task in prange(n_texts * n_heads):
        text, head = task // n_heads, task % n_heads
        first, last = starts[text], starts[text + 1]
        length = last - first
        q = np.empty((length, head_dim), np.float32)  # (T, Dh)
        k = np.empty((length, head_dim), np.float32)  # (T, Dh)
        v = np.empty((length, head_dim), np.float32)  # (T, Dh)
        for d in range(head_dim):
            row_q, row_k, row_v = head * head_dim + d, inner + head * head_dim + d, 2 * inner + head * head_dim + d
            bq, bk, bv = bias[row_q], bias[row_k], bias[row_v]
            for t in range(length):
                q[t, d] = qkv_t[row_q, first + t] + bq
                k[t, d] = qkv_t[row_k, first + t] + bk
                v[t, d] = qkv_t[row_v, first + t] + bv
        scores = np.empty(length, np.float32)  # (T,)
        mixed = np.empty(head_dim, np.float32)  # (Dh,)
        for i in range(length):
            top = -np.inf
            for j in range(length):
                s = np.float32(0.0)
                for d in range(head_dim):
                    s += q[i, d] * k[j, d]
                scores[j] = s
                top = max(top, s)
            total = np.float32(0.0)
            for j in range(length):
                e = np.float32(math.exp(scores[j] - top))
                scores[j] = e
                total += e
            for d in range(head_dim):
                mixed[d] = 0.0
            for j in range(length):
                p = scores[j] / total
                for d in range(head_dim):
                    mixed[d] += p * v[j, d]
            for d in range(head_dim):
                out[first + i, head * head_dim + d] = mixed[d]


def attend_texts(qkv_t: np.ndarray, bias: np.ndarray, starts: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Bidirectional attention of each text over its own rows: qkv_t (3*H*Dh, N) the fused projection without its
    bias (queries pre-scaled), bias (3*H*Dh,), text i in columns starts[i]..starts[i+1]-1; returns (N, H*Dh)."""
    out = np.empty((qkv_t.shape[1], n_heads * head_dim), np.float32)  # (N, H*Dh)
    with launch_lock:
        _attend_texts(qkv_t, bias, starts.astype(np.int64), n_heads, head_dim, out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _add_layer_norm(x, y, bias, weight, norm_bias, eps):  # pragma: no cover (compiled)
    """x[n] = LayerNorm(x[n] + y[n] + bias) * weight + norm_bias, ROW_BLOCK rows a task."""
    n_rows, dim = x.shape
    for block in prange((n_rows + ROW_BLOCK - 1) // ROW_BLOCK):
        first = block * ROW_BLOCK
        count = min(ROW_BLOCK, n_rows - first)
        sums = np.zeros(ROW_BLOCK, np.float32)  # (16,)
        for d in range(dim):
            b = bias[d]
            for r in range(count):
                value = x[first + r, d] + y[first + r, d] + b
                x[first + r, d] = value
                sums[r] += value
        for r in range(count):
            n = first + r
            mean = sums[r] / dim
            var = np.float32(0.0)
            for d in range(dim):
                centered = x[n, d] - mean
                var += centered * centered
            scale = np.float32(1.0) / np.float32(math.sqrt(var / dim + eps))
            for d in range(dim):
                x[n, d] = (x[n, d] - mean) * scale * weight[d] + norm_bias[d]


def add_layer_norm(x: np.ndarray, y: np.ndarray, bias: np.ndarray, weight: np.ndarray, norm_bias: np.ndarray,
                   eps: float) -> np.ndarray:
    """x <- LayerNorm(x + y + bias) (weight, norm_bias) in place, for row-major x (N, D) and y (N, D) in either
    order; returns x."""
    with launch_lock:
        _add_layer_norm(x, y, bias, weight, norm_bias, np.float32(eps))
    return x  # (N, D)


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _bias_gelu(h, bias):  # pragma: no cover (compiled)
    """h[f, n] = GELU(h[f, n] + bias[f]) (tanh form), GELU_CHUNK columns a task, eight lanes at a time."""
    n_rows, n_cols = h.shape
    flat = h.reshape(-1)  # (F*N,)
    per_row = (n_cols + GELU_CHUNK - 1) // GELU_CHUNK
    one = vbroadcast(np.float32(1.0))
    cubic, root = vbroadcast(np.float32(GELU_CUBIC)), vbroadcast(np.float32(-2.0 * SQRT_2_OVER_PI))
    for task in prange(n_rows * per_row):
        row = task // per_row
        first = (task % per_row) * GELU_CHUNK
        last = min(n_cols, first + GELU_CHUNK)
        whole = first + (last - first) // LANES * LANES
        b = vbroadcast(bias[row])
        for c in range(first, whole, LANES):
            x = vadd(vload(flat, row * n_cols + c), b)  # (8,)
            minus_2u = vmul(root, vmul(x, vadd(one, vmul(cubic, vmul(x, x)))))  # (8,)
            vstore(flat, row * n_cols + c, vdiv(x, vadd(one, vexp(minus_2u))))  # x (1 + tanh u) / 2 = x σ(2u)
        for c in range(whole, last):
            x = flat[row * n_cols + c] + bias[row]
            minus_2u = np.float32(-2.0 * SQRT_2_OVER_PI) * x * (np.float32(1.0) + np.float32(GELU_CUBIC) * x * x)
            flat[row * n_cols + c] = x / (np.float32(1.0) + np.float32(math.exp(min(minus_2u, np.float32(88.0)))))


def bias_gelu(h: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """h <- GELU(h + bias) in place for a row-major h (F, N) and bias (F,) (a row's bias); returns h."""
    with launch_lock:
        _bias_gelu(h, bias)
    return h  # (F, N)


def warm() -> None:
    """Compile the kernels into numba's cache (a worker's first batch then pays no compile)."""
    starts = np.array([0, 2, 5], np.int64)  # (B+1,)
    attend_texts(np.zeros((6, 5), np.float32), np.zeros(6, np.float32), starts, 1, 2)
    add_layer_norm(np.ones((3, 4), np.float32), np.ones((4, 3), np.float32).T, np.zeros(4, np.float32),
                   np.ones(4, np.float32), np.zeros(4, np.float32), 1e-12)
    add_layer_norm(np.ones((3, 4), np.float32), np.ones((3, 4), np.float32), np.zeros(4, np.float32),
                   np.ones(4, np.float32), np.zeros(4, np.float32), 1e-12)
    bias_gelu(np.zeros((2, 2 * LANES + 3), np.float32), np.zeros(2, np.float32))
