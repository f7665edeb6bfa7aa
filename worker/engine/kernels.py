"""Compiled CPU kernels (numba) for the parts of the forward pass numpy cannot do without copies.

Paged decode attention reads every sequence's keys and values in place through its block table: the numpy
path first gathers all blocks into a padded (Hkv, B, L, Dh) batch per layer, which at long contexts cost more
than the attention itself. Parallel kernels run on numba's `workqueue` layer (fork-safe, always available)
behind a process-wide lock, because that layer must not be entered by two threads at once.
"""

from __future__ import annotations

import math
import threading

import numba
import numpy as np
from numba import njit, prange

numba.config.THREADING_LAYER = "workqueue"  # before the first parallel call; fork-safe, needs no OpenMP/TBB
_launch_lock = threading.Lock()  # workqueue is not re-entrant across threads


def set_threads(count: int) -> None:
    """Threads the parallel kernels use (at most the cores numba saw at start-up)."""
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))


@njit(parallel=True, fastmath=True, cache=True)
def _paged_decode(q, keys, values, tables, lengths, first_pos, out):  # pragma: no cover (compiled)
    """One query per sequence over its positions [first_pos, length), read from blocks through its table."""
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
                    s += q_row[d] * k_row[d]
                scores[g, p - first] = s
        for g in range(group):
            row = scores[g]  # (L,)
            top = row.max()
            total = np.float32(0.0)
            for i in range(length - first):
                e = np.float32(math.exp(row[i] - top))
                row[i] = e
                total += e
            inv = np.float32(1.0) / total
            o = out[b, (h * group + g) * head_dim : (h * group + g + 1) * head_dim]  # (Dh,)
            o[:] = 0.0
            for p in range(first, length):
                w = row[p - first] * inv
                v_row = values[h, tables[b, p // block_size], p % block_size]  # (Dh,)
                for d in range(head_dim):
                    o[d] += w * v_row[d]


def paged_attend_decode(q: np.ndarray, keys: np.ndarray, values: np.ndarray, tables: np.ndarray,
                        lengths: np.ndarray, first_pos: np.ndarray) -> np.ndarray:
    """Decode attention of q (B, H, Dh) over each row's positions [first_pos, lengths) in the pool: (B, H*Dh).

    keys/values are one layer's arena (Hkv, NB, BS, Dh); tables (B, nb) hold each row's block ids in order.
    """
    b, n_heads, head_dim = q.shape
    out = np.empty((b, n_heads * head_dim), np.float32)  # (B, H*Dh)
    with _launch_lock:
        _paged_decode(np.ascontiguousarray(q), keys, values, tables, lengths, first_pos, out)
    return out
