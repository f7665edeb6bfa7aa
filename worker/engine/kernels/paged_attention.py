"""Paged attention, compiled (numba): every row of a step is one query over its sequence's keys and values, read
in place through its block table. The numpy path first gathered all blocks into a padded (Hkv, B, L, Dh) batch per
layer, which at long contexts cost more than the attention itself. Every row of a step is one query of it, a decode
token or a prompt row alike (forward_batch.py), so a row's attention never depends on the step around it (batch
invariance). The vector kernel holds its running sums in eight-lane vectors (simd.py), which numba's own
vectorisation of the same loops did not keep in registers. The threading set-up and launch lock every kernel uses
are numba_runtime.py's (its docstring says why OpenMP); the per-row steps around attention (the KV row store,
RoPE, RMS norm, SwiGLU) are layer_kernels.py's.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from worker.engine.kernels.numba_runtime import launch_lock
from worker.engine.kernels.simd import (
    LANES,
    vadd,
    vbroadcast,
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
    n_kv, per_group, block_size = keys.shape[1], keys.shape[2], keys.shape[3]  # keys/values (NG, Hkv, G, BS, Dh)
    group = n_heads // n_kv
    for task in prange(n_seqs * n_kv):
        b = task // n_kv
        h = task % n_kv
        first = first_pos[b]
        length = lengths[b]
        scores = np.empty((group, length - first), np.float32)  # (G, L)
        for p in range(first, length):
            block = tables[b, p // block_size]
            k_row = keys[block // per_group, h, block % per_group, p % block_size]  # (Dh,)
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
                block = tables[b, p // block_size]
                v_row = values[block // per_group, h, block % per_group, p % block_size]  # (Dh,)
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
    n_kv, per_group, block_size = keys.shape[1], keys.shape[2], keys.shape[3]  # keys/values (NG, Hkv, G, BS, Dh)
    group = n_heads // n_kv
    flat_q = q.reshape(-1)  # (B*H*Dh,)
    flat_keys = keys.reshape(-1)  # (NG*Hkv*G*BS*Dh,)
    flat_values = values.reshape(-1)  # (NG*Hkv*G*BS*Dh,)
    flat_out = out.reshape(-1)  # (B*H*Dh,)
    for task in prange(n_seqs * n_kv):
        b = task // n_kv
        h = task % n_kv
        first = first_pos[b]
        n = lengths[b] - first
        rows = np.empty(n, np.int64)  # (L,) flat offset of each position's key/value row
        p = first
        while p < first + n:  # a block at a time: one division per block, not per position
            index = p // block_size
            block = tables[b, index]
            start = ((((block // per_group) * n_kv + h) * per_group + block % per_group) - index) * block_size
            for at in range(p, min(first + n, (index + 1) * block_size)):
                rows[at - first] = (start + at) * head_dim
            p = (index + 1) * block_size
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

    keys/values are one layer's arena (NG, Hkv, G, BS, Dh) (worker/engine/kv/arena_layout.py), float16 or float32
    as the pool keeps them (another dtype is converted to float32 first, a copy); tables (B, nb) hold each row's
    block ids in order.
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
