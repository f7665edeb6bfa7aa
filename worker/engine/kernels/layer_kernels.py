"""Compiled CPU kernels (numba) for the parts of the forward pass numpy cannot do without copies.

Paged attention reads every sequence's keys and values in place through its block table: the numpy
path first gathers all blocks into a padded (Hkv, B, L, Dh) batch per layer, which at long contexts cost more
than the attention itself. Every row of a step is one query of it, a decode token or a prompt row alike
(forward_batch.py), so a row's attention never depends on the step around it (batch invariance). The vector
kernel holds its running sums in eight-lane vectors (simd.py), which numba's own vectorisation of the same loops
did not keep in registers. The matmuls are in float_matmul.py, interleaved_k_matmul.py, interleaved_matmul.py and mxfp4_matmul.py; the threading
set-up and launch lock all use are in numba_runtime.py. SwiGLU runs here as well, across the kernel threads:
numpy's four single-threaded passes left the second core idle. So do the small per-row steps whose numpy passes
cost more than their arithmetic (each in one thread, no launch): the KV row store, RoPE (both bit for bit numpy's)
and RMS normalisation (one fixed order per row).

Parallel kernels prefer numba's OpenMP layer: on the 2-core machine the `workqueue` layer launched the block
matmul at half the speed (15-24 ms against 10 ms for SmolLM2's matrices). Where OpenMP is missing numba falls
back to workqueue. Launches go through a process-wide lock, because workqueue must not be entered by two threads
at once. OpenMP is not fork-safe: the engine runs in processes started by exec, never forked after a launch.
OpenMP's idle threads spin before they sleep: numba_runtime.set_spin keeps libgomp's default for a decoder and cuts
it to 10,000 rounds where OpenBLAS's threads share the step (an encoder), whose cores the spin would take.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numba import njit, prange

from worker.engine.kernels.numba_runtime import launch_lock
from worker.engine.kernels.simd import (
    LANES,
    narrow,
    vadd,
    vbroadcast,
    vdiv,
    vexp,
    vfma,
    vload,
    vload_wide,
    vmul,
    vstore,
    vsub,
    vsum,
    vzero,
    widen,
)


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _paged_decode(q, keys, values, tables, lengths, first_pos, sinks, out):  # pragma: no cover (compiled)
    """One query per sequence over its positions [first_pos, length), read from blocks through its table (keys and
    values float32, or float16 bits as uint16); sinks (H,) (or empty): a logit per head in each softmax's
    denominator only (gpt-oss's attention sinks)."""
    n_seqs, n_heads, head_dim = q.shape  # q (B, H, Dh), pre-scaled
    n_kv = keys.shape[0]  # keys/values (Hkv, NB, BS, Dh)
    block_size = keys.shape[2]
    group = n_heads // n_kv
    for task in prange(n_seqs * n_kv):
        b = task // n_kv
        h = task % n_kv
        first = first_pos[b]
        length = lengths[b]
        scores = np.empty((group, length - first), np.float32)  # (G, L)
        for p in range(first, length):
            k_row = keys[h, tables[b, p // block_size], p % block_size]  # (Dh,)
            for g in range(group):
                q_row = q[b, h * group + g]  # (Dh,)
                s = np.float32(0.0)
                for d in range(head_dim):
                    s += q_row[d] * widen(k_row[d])
                scores[g, p - first] = s
        for g in range(group):
            row = scores[g]  # (L,)
            top = row.max()
            if sinks.size:
                top = max(top, sinks[h * group + g])
            total = np.float32(0.0)
            for i in range(length - first):
                e = np.float32(math.exp(row[i] - top))
                row[i] = e
                total += e
            if sinks.size:
                total += np.float32(math.exp(sinks[h * group + g] - top))
            inv = np.float32(1.0) / total
            o = out[b, (h * group + g) * head_dim : (h * group + g + 1) * head_dim]  # (Dh,)
            o[:] = 0.0
            for p in range(first, length):
                w = row[p - first] * inv
                v_row = values[h, tables[b, p // block_size], p % block_size]  # (Dh,)
                for d in range(head_dim):
                    o[d] += w * widen(v_row[d])


@njit(inline="always")
def _softmax_in_place(weights, at, n, top, sinks, head):  # pragma: no cover (compiled)
    """exp(weights[at:at+n] - top) in place, and 1 / their sum (with exp(sinks[head] - top) when sinks has
    entries) broadcast (float32x8)."""
    sums = vzero()  # (8,)
    tops = vbroadcast(top)  # (8,)
    whole = n - n % LANES
    for i in range(0, whole, LANES):
        e = vexp(vsub(vload(weights, at + i), tops))  # (8,)
        vstore(weights, at + i, e)
        sums = vadd(sums, e)  # (8,)
    total = vsum(sums)
    for i in range(whole, n):
        e = np.float32(math.exp(weights[at + i] - top))
        weights[at + i] = e
        total += e
    if sinks.size:
        total += np.float32(math.exp(sinks[head] - top))
    return vbroadcast(np.float32(1.0) / total)  # (8,)


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _paged_decode_vectors(q, keys, values, tables, lengths, first_pos, sinks, out):  # pragma: no cover (compiled)
    """_paged_decode for head_dim % 32 == 0 and contiguous arenas, in float32x8 vectors (simd.py). The query heads
    of a key/value head go two at a time: each key and value row loaded serves both, and their sums are independent
    chains (a score's own two chains and a value sum's own order are as for one head: a head's result does not
    depend on its pair; an odd last head is computed twice)."""
    n_seqs, n_heads, head_dim = q.shape  # q (B, H, Dh), pre-scaled
    n_kv, n_blocks, block_size = keys.shape[0], keys.shape[1], keys.shape[2]  # keys/values (Hkv, NB, BS, Dh)
    group = n_heads // n_kv
    flat_q = q.reshape(-1)  # (B*H*Dh,)
    flat_keys = keys.reshape(-1)  # (Hkv*NB*BS*Dh,)
    flat_values = values.reshape(-1)  # (Hkv*NB*BS*Dh,)
    flat_out = out.reshape(-1)  # (B*H*Dh,)
    for task in prange(n_seqs * n_kv):
        b = task // n_kv
        h = task % n_kv
        first = first_pos[b]
        n = lengths[b] - first
        rows = np.empty(n, np.int64)  # (L,) flat offset of each position's key/value row
        for i in range(n):
            p = first + i
            rows[i] = ((h * n_blocks + tables[b, p // block_size]) * block_size + p % block_size) * head_dim
        weights = np.empty(2 * n, np.float32)  # (2*L,) the pair's scores, then their softmax weights
        for g0 in range(0, group, 2):
            g1 = min(g0 + 1, group - 1)
            q0 = (b * n_heads + h * group + g0) * head_dim  # also the output row's offset
            q1 = (b * n_heads + h * group + g1) * head_dim
            top0 = np.float32(-np.inf)
            top1 = np.float32(-np.inf)
            for i in range(n):
                a0 = vzero()  # (8,) head g0
                a1 = vzero()
                c0 = vzero()  # (8,) head g1
                c1 = vzero()
                for d in range(0, head_dim, 2 * LANES):
                    k0 = vload_wide(flat_keys, rows[i] + d)  # (8,)
                    k1 = vload_wide(flat_keys, rows[i] + d + LANES)  # (8,)
                    a0 = vfma(vload(flat_q, q0 + d), k0, a0)  # (8,)
                    a1 = vfma(vload(flat_q, q0 + d + LANES), k1, a1)  # (8,)
                    c0 = vfma(vload(flat_q, q1 + d), k0, c0)  # (8,)
                    c1 = vfma(vload(flat_q, q1 + d + LANES), k1, c1)  # (8,)
                score0 = vsum(vadd(a0, a1))
                score1 = vsum(vadd(c0, c1))
                weights[i] = score0
                weights[n + i] = score1
                top0 = max(top0, score0)
                top1 = max(top1, score1)
            if sinks.size:
                top0 = max(top0, sinks[h * group + g0])
                top1 = max(top1, sinks[h * group + g1])
            inv0 = _softmax_in_place(weights, 0, n, top0, sinks, h * group + g0)  # (8,)
            inv1 = _softmax_in_place(weights, n, n, top1, sinks, h * group + g1)  # (8,)
            for d in range(0, head_dim, 4 * LANES):  # 32 dims a pass: few passes over the value rows
                a0 = vzero()  # (8,) head g0, dims d:d+8
                a1 = vzero()
                a2 = vzero()
                a3 = vzero()
                c0 = vzero()  # (8,) head g1
                c1 = vzero()
                c2 = vzero()
                c3 = vzero()
                for i in range(n):
                    w0 = vbroadcast(weights[i])  # (8,)
                    w1 = vbroadcast(weights[n + i])  # (8,)
                    row = rows[i] + d
                    v0 = vload_wide(flat_values, row)  # (8,)
                    v1 = vload_wide(flat_values, row + LANES)  # (8,)
                    v2 = vload_wide(flat_values, row + 2 * LANES)  # (8,)
                    v3 = vload_wide(flat_values, row + 3 * LANES)  # (8,)
                    a0, a1, a2, a3 = vfma(w0, v0, a0), vfma(w0, v1, a1), vfma(w0, v2, a2), vfma(w0, v3, a3)  # (8,) x4
                    c0, c1, c2, c3 = vfma(w1, v0, c0), vfma(w1, v1, c1), vfma(w1, v2, c2), vfma(w1, v3, c3)  # (8,) x4
                vstore(flat_out, q0 + d, vmul(a0, inv0))
                vstore(flat_out, q0 + d + LANES, vmul(a1, inv0))
                vstore(flat_out, q0 + d + 2 * LANES, vmul(a2, inv0))
                vstore(flat_out, q0 + d + 3 * LANES, vmul(a3, inv0))
                vstore(flat_out, q1 + d, vmul(c0, inv1))
                vstore(flat_out, q1 + d + LANES, vmul(c1, inv1))
                vstore(flat_out, q1 + d + 2 * LANES, vmul(c2, inv1))
                vstore(flat_out, q1 + d + 3 * LANES, vmul(c3, inv1))


_NO_SINKS = np.zeros(0, np.float32)


def paged_attend_decode(q: np.ndarray, keys: np.ndarray, values: np.ndarray, tables: np.ndarray,
                        lengths: np.ndarray, first_pos: np.ndarray, sinks: np.ndarray | None = None) -> np.ndarray:
    """Decode attention of q (B, H, Dh) over each row's positions [first_pos, lengths) in the pool: (B, H*Dh);
    sinks (H,): a logit per head that joins each softmax's denominator only (gpt-oss), or None.

    keys/values are one layer's arena (Hkv, NB, BS, Dh), float16 or float32 as the pool keeps them (another
    dtype is converted to float32 first, a copy); tables (B, nb) hold each row's block ids in order.
    """
    if keys.dtype == np.float16 and values.dtype == np.float16:
        keys, values = keys.view(np.uint16), values.view(np.uint16)  # the kernels widen float16 bits (simd.py)
    elif keys.dtype != np.float32 or values.dtype != np.float32:
        keys, values = keys.astype(np.float32), values.astype(np.float32)
    b, n_heads, head_dim = q.shape
    out = np.empty((b, n_heads * head_dim), np.float32)  # (B, H*Dh)
    kernel = (_paged_decode_vectors if head_dim % (4 * LANES) == 0 and keys.flags.c_contiguous
              and values.flags.c_contiguous else _paged_decode)
    with launch_lock:
        kernel(np.ascontiguousarray(q), keys, values, tables, lengths, first_pos,
               _NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32), out)
    return out


@njit(nogil=True, cache=True)
def _store_halves(rows, arena, blocks, offsets):  # pragma: no cover (compiled)
    """arena[h, blocks[n], offsets[n]] = rows[n, h] as float16 bits (rows (N, Hkv, Dh) float32, any strides; arena
    (Hkv, NB, BS, Dh) uint16)."""
    for n in range(rows.shape[0]):
        block, offset = blocks[n], offsets[n]
        for h in range(rows.shape[1]):
            for d in range(rows.shape[2]):
                arena[h, block, offset, d] = narrow(rows[n, h, d])


def store_rows(arena: np.ndarray, blocks: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> None:
    """Keys or values rows (N, Hkv, Dh) into one layer's arena (Hkv, NB, BS, Dh) at (blocks, offsets) (N,) each:
    float32 rows into a float16 arena by a compiled loop (numpy's rounding, without its scatter's transposed copy:
    about 3x faster at 16 rows), anything else by numpy."""
    if arena.dtype == np.float16 and rows.dtype == np.float32:
        _store_halves(rows, arena.view(np.uint16), blocks, offsets)
    else:
        arena[:, blocks, offsets] = rows.transpose(1, 0, 2)  # (Hkv, N, Dh)


@njit(nogil=True, cache=True)
def _rotate(x, cos, sin, half):  # pragma: no cover (compiled)
    """Features i and half + i (i < half) of every head of x (N, H, Dh), any strides, rotated in place by the angle
    whose cosine and sine are cos, sin[n, 0, i]: each new value two products and a sum, rounded as numpy's passes
    round them (no fused multiply-add)."""
    for n in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                first, second = x[n, h, i], x[n, h, half + i]
                c, s = cos[n, 0, i], sin[n, 0, i]
                x[n, h, i] = first * c - second * s
                x[n, h, half + i] = second * c + first * s


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope_dim: int) -> None:
    """Rotary embedding of the first rope_dim features of every head of x (N, H, Dh) float32, in place, in half-
    rotation (NEOX) form; cos, sin (N, 1, rope_dim / 2) float32. Bit for bit RotaryTable's numpy passes, about 3x
    faster at 16 rows."""
    _rotate(x, cos, sin, rope_dim // 2)


@njit(nogil=True, cache=True)
def _rms_rows(x, eps, out):  # pragma: no cover (compiled)
    """out[n] = x[n] / sqrt(mean of x[n]'s squares + eps) for x, out (N, D) row-major float32: the squares summed in
    two eight-lane chains (fused multiply-adds, lane i of chain j taking columns 16c + 8j + i in order), the chains
    and lanes added in one fixed order, the tail in order after them; whatever the rows around it."""
    n_rows, width = x.shape
    whole = width // (2 * LANES) * (2 * LANES)
    flat, flat_out = x.reshape(-1), out.reshape(-1)  # (N*D,) each
    inverse_width = np.float32(1.0 / width)
    for n in range(n_rows):
        at = n * width
        first, second = vzero(), vzero()  # (8,) each
        for c in range(at, at + whole, 2 * LANES):
            a, b = vload(flat, c), vload(flat, c + LANES)  # (8,) each
            first, second = vfma(a, a, first), vfma(b, b, second)  # (8,) each
        total = vsum(vadd(first, second))
        for c in range(at + whole, at + width):
            total += flat[c] * flat[c]
        scale = np.float32(math.sqrt(total * inverse_width + eps))
        divisor = vbroadcast(scale)  # (8,)
        for c in range(at, at + width - width % LANES, LANES):
            vstore(flat_out, c, vdiv(vload(flat, c), divisor))  # (8,): each quotient rounded once, as a scalar's
        for c in range(at + width - width % LANES, at + width):
            flat_out[c] = flat[c] / scale


def rms_rows(x: np.ndarray, eps: float) -> np.ndarray:
    """Every row of x (N, D) float32 divided by its root mean square (+ eps), each row in one fixed order whatever
    the step holds (batch invariance): (N, D), a new array."""
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)  # (N, D)
    _rms_rows(x, np.float32(eps), out)
    return out


SWIGLU_CHUNK = 256  # columns per task of the SwiGLU kernel


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _swiglu(gate_up, out):  # pragma: no cover (compiled)
    """out[k, c] = SiLU(gate_up[k, c]) * gate_up[k, F + c], in chunks of SWIGLU_CHUNK columns across threads."""
    n_rows, two_f = gate_up.shape  # gate_up (N, 2F); out (N, F)
    f = two_f // 2
    flat = gate_up.reshape(-1)  # (N*2F,)
    flat_out = out.reshape(-1)  # (N*F,)
    per_row = (f + SWIGLU_CHUNK - 1) // SWIGLU_CHUNK
    one = vbroadcast(np.float32(1.0))  # (8,)
    for task in prange(n_rows * per_row):
        k = task // per_row
        first = (task % per_row) * SWIGLU_CHUNK
        last = min(f, first + SWIGLU_CHUNK)
        whole = first + (last - first) // LANES * LANES
        for c in range(first, whole, LANES):
            g = vload(flat, k * two_f + c)  # (8,) gate
            silu = vdiv(g, vadd(one, vexp(vsub(vzero(), g))))  # (8,)
            vstore(flat_out, k * f + c, vmul(silu, vload(flat, k * two_f + f + c)))
        for c in range(whole, last):
            g = flat[k * two_f + c]
            flat_out[k * f + c] = g / (np.float32(1.0) + np.float32(math.exp(-g))) * flat[k * two_f + f + c]


def swiglu(gate_up: np.ndarray) -> np.ndarray:
    """SiLU(gate) * up for a row-major fused (N, 2F) float32 gate/up projection, on every kernel thread: (N, F)."""
    out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), np.float32)  # (N, F)
    with launch_lock:
        _swiglu(gate_up, out)
    return out


def warm_up() -> None:
    """Compile every kernel into numba's cache (an image build runs this so that workers start without it)."""
    for head_dim, dtype in itertools.product((8, 4 * LANES), (np.float16, np.float32)):  # scalar and vector kernels
        keys = np.zeros((1, 2, 4, head_dim), dtype)  # (Hkv, NB, BS, Dh)
        paged_attend_decode(np.zeros((1, 2, head_dim), np.float32), keys, keys, np.ones((1, 1), np.int64),
                            np.ones(1, np.int64), np.zeros(1, np.int64))
    swiglu(np.zeros((2, 2 * SWIGLU_CHUNK + 2 * LANES + 2), np.float32))
    rms_rows(np.ones((1, 3 * LANES), np.float32), 1e-6)
    rows = np.zeros((1, 2, 1, 8), np.float32)[:, 1]  # (N, Hkv, Dh), strided as a step's k and v
    store_rows(np.zeros((1, 2, 4, 8), np.float16), np.zeros(1, np.int64), np.zeros(1, np.int64), rows)
    angles = np.zeros((1, 1, 4), np.float32)  # (N, 1, R/2)
    rotate(np.zeros((1, 2 * 8 + 8), np.float32)[:, :16].reshape(1, 2, 8), angles, angles, 8)  # a strided (N, H, Dh)
    from worker.engine.kernels import (  # loaded only when an image build warms them
        float_matmul,
        interleaved_k_matmul,
        interleaved_matmul,
        mxfp4_matmul,
    )

    float_matmul.warm({16, 32})
    interleaved_matmul.warm()
    interleaved_k_matmul.warm()
    mxfp4_matmul.warm()
