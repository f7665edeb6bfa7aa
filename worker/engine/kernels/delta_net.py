"""Compiled kernels of a gated delta-net layer (Qwen3.5, Qwen3-Next): the short causal convolution and the gated
delta rule, each over a step's sequences in place of their recurrent state slots (recurrent_state.py).

Both run token by token, as ggml-cpu's ssm_conv and gated_delta_net do: a prompt of T tokens is T one-token updates,
so a row's output never depends on how its prompt was chunked or on the other sequences of the step (batch
invariance, as for attention). The chunked (WY) form of the delta rule trades that for matrix products that pay on
a GPU; on a CPU the per-token update reads each head's (Dv, Dk) state from L1/L2 and costs less than the step's
projections. Work is split across threads by (sequence, channel chunk) and (sequence, value head).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from worker.engine.kernels.numba_runtime import launch_lock

CONV_CHUNK = 256  # channels per task of the convolution kernel
SERIAL_CONV_VALUES = 1 << 15  # at most this many new values (rows x channels): one thread, no parallel launch
SOFTPLUS_LINEAR = np.float32(20.0)  # ggml's softplus returns x itself above this


@njit(nogil=True, cache=True, inline="always")
def _conv_task(x, starts, slots, tails, taps, out, b, first, last):  # pragma: no cover (compiled)
    """Sequence b's channels [first, last): out[t, c] = SiLU(sum_i input[t + i, c] * taps[c, i]) over its input (its
    slot's last K-1 rows, tails (S, K-1, C), then its new rows of x (N, C)); then the tail becomes the input's last
    K-1 rows."""
    width = taps.shape[1]
    keep = width - 1
    slot, begin, end = slots[b], starts[b], starts[b + 1]
    tail = tails[slot]  # (K-1, C)
    for t in range(begin, end):
        for c in range(first, last):
            acc = np.float32(0.0)
            for i in range(width):
                j = t - begin + i  # row j of [tail; new rows]
                value = tail[j, c] if j < keep else x[begin + j - keep, c]
                acc += value * taps[c, i]
            out[t, c] = acc / (np.float32(1.0) + np.float32(math.exp(-acc)))
    n_new = end - begin
    for j in range(keep):  # ascending: a row moved up is read before it is overwritten
        source = n_new + j
        for c in range(first, last):
            tail[j, c] = tail[source, c] if source < keep else x[begin + source - keep, c]


@njit(parallel=True, nogil=True, cache=True)
def _short_conv(x, starts, slots, tails, taps, out):  # pragma: no cover (compiled)
    """Every sequence's convolution (_conv_task), CONV_CHUNK channels a task, across threads."""
    channels = taps.shape[0]
    per_seq = (channels + CONV_CHUNK - 1) // CONV_CHUNK
    for task in prange(slots.shape[0] * per_seq):
        first = (task % per_seq) * CONV_CHUNK
        _conv_task(x, starts, slots, tails, taps, out, task // per_seq, first, min(channels, first + CONV_CHUNK))


@njit(nogil=True, cache=True)
def _short_conv_serial(x, starts, slots, tails, taps, out):  # pragma: no cover (compiled)
    """The same tasks in one thread (a decode step's few rows: no parallel launch)."""
    for b in range(slots.shape[0]):
        _conv_task(x, starts, slots, tails, taps, out, b, 0, taps.shape[0])


def short_conv(x: np.ndarray, starts: np.ndarray, slots: np.ndarray, tails: np.ndarray,
               taps: np.ndarray) -> np.ndarray:
    """The causal depthwise convolution of every sequence's new rows x (N, C) after its slot's tail (S, K-1, C),
    taps (C, K), with SiLU: (N, C); each slot's tail is advanced in place. Each output is the same sum whether the
    step runs it across threads or in one."""
    out = np.empty_like(x)  # (N, C)
    x = np.ascontiguousarray(x)
    if x.size <= SERIAL_CONV_VALUES:
        _short_conv_serial(x, starts, slots, tails, taps, out)
    else:
        with launch_lock:
            _short_conv(x, starts, slots, tails, taps, out)
    return out


@njit(nogil=True, cache=True)
def _gates(beta_alpha, dt_bias, rate, decay, beta):  # pragma: no cover (compiled)
    """beta = sigmoid(b) and decay = softplus(a + dt_bias) * rate (ggml's softplus: x itself above 20) for the
    (N, 2*Hv) projection [b | a]."""
    heads = dt_bias.shape[0]
    for n in range(beta_alpha.shape[0]):
        for h in range(heads):
            beta[n, h] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-beta_alpha[n, h])))
            a = beta_alpha[n, heads + h] + dt_bias[h]
            soft = a if a > SOFTPLUS_LINEAR else np.float32(math.log(np.float32(1.0) + np.float32(math.exp(a))))
            decay[n, h] = soft * rate[h]


def gates(beta_alpha: np.ndarray, dt_bias: np.ndarray, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log decay, beta), each (N, Hv), from the (N, 2*Hv) projection of beta then alpha logits."""
    n, heads = beta_alpha.shape[0], dt_bias.shape[0]
    decay, beta = np.empty((n, heads), np.float32), np.empty((n, heads), np.float32)  # (N, Hv) x2
    _gates(np.ascontiguousarray(beta_alpha), dt_bias, rate, decay, beta)
    return decay, beta


@njit(nogil=True, cache=True)
def _gated_norm(x, z, weight, eps, out):  # pragma: no cover (compiled)
    """out[n, h] = x[n, h] / sqrt(mean(x[n, h]^2) + eps) * weight * SiLU(z[n, h]) per head vector."""
    n_rows, heads, width = x.shape
    for n in range(n_rows):
        for h in range(heads):
            total = np.float32(0.0)
            for i in range(width):
                total += x[n, h, i] * x[n, h, i]
            scale = np.float32(math.sqrt(total / np.float32(width) + eps))
            for i in range(width):
                g = z[n, h * width + i]
                silu = g / (np.float32(1.0) + np.float32(math.exp(-g)))
                out[n, h * width + i] = x[n, h, i] / scale * weight[i] * silu


def gated_norm(x: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """The delta-net output x (N, Hv, Dv) RMS-normed per head with weight (Dv,), times SiLU(z) (N, Hv*Dv): (N,
    Hv*Dv), row-major."""
    out = np.empty((x.shape[0], x.shape[1] * x.shape[2]), np.float32)  # (N, Hv*Dv)
    _gated_norm(x, np.ascontiguousarray(z), weight, np.float32(eps), out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _gated_delta(q, k, v, decay, beta, starts, slots, states, scale, out):  # pragma: no cover (compiled)
    """Per sequence and value head h (reading key head h % Hk), per token: S *= exp(decay); for each value row j,
    d = (v_j - S_j . k) * beta; S_j += d * k; out_j = (S_j . q) * scale. S (Dv, Dk) is the slot's state, row j of
    S the keys' weights for value j (ggml's transposed layout: rows contiguous)."""
    n_seqs = slots.shape[0]
    n_value_heads, rows, width = states.shape[1], states.shape[2], states.shape[3]
    n_key_heads = q.shape[1]
    for task in prange(n_seqs * n_value_heads):
        b = task // n_value_heads
        h = task % n_value_heads
        kh = h % n_key_heads
        state = states[slots[b], h]  # (Dv, Dk)
        for t in range(starts[b], starts[b + 1]):
            factor = np.float32(math.exp(decay[t, h]))
            rate = beta[t, h]
            for j in range(rows):
                dot = np.float32(0.0)
                for i in range(width):
                    state[j, i] *= factor
                    dot += state[j, i] * k[t, kh, i]
                delta = (v[t, h, j] - dot) * rate
                read = np.float32(0.0)
                for i in range(width):
                    state[j, i] += k[t, kh, i] * delta
                    read += state[j, i] * q[t, kh, i]
                out[t, h, j] = read * scale


def gated_delta(q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray, beta: np.ndarray,
                starts: np.ndarray, slots: np.ndarray, states: np.ndarray) -> np.ndarray:
    """The gated delta rule over every sequence's new rows: q, k (N, Hk, Dk) L2-normalised, v (N, Hv, Dv), decay
    and beta (N, Hv); states (S, Hv, Dv, Dk) advanced in place: the outputs (N, Hv, Dv), scaled by 1/sqrt(Dk)."""
    out = np.empty(v.shape, np.float32)  # (N, Hv, Dv)
    scale = np.float32(1.0 / math.sqrt(q.shape[2]))
    with launch_lock:
        _gated_delta(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                     np.ascontiguousarray(decay), np.ascontiguousarray(beta), starts, slots, states, scale, out)
    return out


def warm() -> None:
    """Compile every kernel (a hybrid model's load calls this, so the first request does not)."""
    starts, slots = np.array([0, 2], np.int64), np.zeros(1, np.int64)  # (B+1,), (B,)
    for channels in (4, SERIAL_CONV_VALUES):  # the serial and the parallel convolution
        short_conv(np.zeros((2, channels), np.float32), starts, slots, np.zeros((1, 3, channels), np.float32),
                   np.zeros((channels, 4), np.float32))
    gates(np.zeros((2, 4), np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32))
    gated_norm(np.zeros((2, 2, 4), np.float32), np.zeros((2, 8), np.float32), np.ones(4, np.float32), 1e-6)
    gated_delta(np.zeros((2, 1, 4), np.float32), np.zeros((2, 1, 4), np.float32), np.zeros((2, 2, 4), np.float32),
                np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32), starts, slots,
                np.zeros((1, 2, 4, 4), np.float32))
