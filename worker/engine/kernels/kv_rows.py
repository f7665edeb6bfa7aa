"""Copies between one KV pool block, across every layer, and a packed buffer: the host tier's block bytes
(worker/engine/kv/tier_link.py). The buffer holds keys then values, layer by layer, head by head, the block's first
`rows` rows of each (2, L, Hkv, rows, Dh). One compiled loop instead of two numpy copies per layer, each a strided
copy of Hkv pieces: a partial block's snapshot, on the step's thread, took 0.37 ms that way at 64 streams of the 1B.
The arenas come as a tuple of 64-bit word views (NG, Hkv, G, BS, Dh x itemsize / 8), whatever the pool's dtype; one
head's rows of a block are one contiguous run, copied as such (a row at a time took 81 us for a one-row snapshot of
the 1B, 142 us for eight).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _gather(keys, values, block, rows, out):  # pragma: no cover (compiled)
    """out (2 L Hkv rows W,) uint64 <- the first rows of `block` in every layer's keys and values (NG Hkv G BS W,)
    uint64: a block's rows of one head are contiguous, so each (layer, head) is one run of rows * W words."""
    n_kv, per_group, block_size, width = keys[0].shape[1], keys[0].shape[2], keys[0].shape[3], keys[0].shape[4]
    at_block = ((block // per_group) * n_kv * per_group + block % per_group) * block_size * width
    run = rows * width
    at = 0
    for side in range(2):
        arenas = keys if side == 0 else values
        for layer in range(len(arenas)):
            arena = arenas[layer].reshape(-1)  # (NG Hkv G BS W,)
            for h in range(n_kv):
                first = at_block + h * per_group * block_size * width
                for i in range(run):
                    out[at + i] = arena[first + i]
                at += run


@njit(nogil=True, cache=True)
def _scatter(data, keys, values, block, rows):  # pragma: no cover (compiled)
    """The reverse of _gather: data (2 L Hkv rows W,) uint64 into the first rows of `block`."""
    n_kv, per_group, block_size, width = keys[0].shape[1], keys[0].shape[2], keys[0].shape[3], keys[0].shape[4]
    at_block = ((block // per_group) * n_kv * per_group + block % per_group) * block_size * width
    run = rows * width
    at = 0
    for side in range(2):
        arenas = keys if side == 0 else values
        for layer in range(len(arenas)):
            arena = arenas[layer].reshape(-1)  # (NG Hkv G BS W,)
            for h in range(n_kv):
                first = at_block + h * per_group * block_size * width
                for i in range(run):
                    arena[first + i] = data[at + i]
                at += run


def byte_views(arenas: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Each arena (NG, Hkv, G, BS, Dh), C-contiguous, as 64-bit words (NG, Hkv, G, BS, Dh x itemsize / 8), whatever
    the pool's dtype, for gather_rows and scatter_rows."""
    if not all(a.flags.c_contiguous for a in arenas):
        raise ValueError("the tier copies whole runs of a pool's arenas: they must be C-contiguous")
    return tuple(a.view(np.uint64) for a in arenas)


def gather_rows(keys: tuple[np.ndarray, ...], values: tuple[np.ndarray, ...], block: int, rows: int,
                out: np.ndarray) -> None:
    """The first `rows` rows of `block`, every layer's keys then values, into out (bytes,) uint8, packed."""
    _gather(keys, values, block, rows, out.view(np.uint64))


def scatter_rows(data: np.ndarray, keys: tuple[np.ndarray, ...], values: tuple[np.ndarray, ...], block: int,
                 rows: int) -> None:
    """gather_rows' bytes (bytes,) uint8 back into the first `rows` rows of `block`."""
    _scatter(data.view(np.uint64), keys, values, block, rows)
