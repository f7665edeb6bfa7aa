"""Copies between one KV pool block, across every layer, and a packed buffer: the host tier's block bytes
(worker/engine/kv/tier_link.py). The buffer holds keys then values, layer by layer, head by head, the block's first
`rows` rows of each (2, L, Hkv, rows, Dh). One compiled loop instead of two numpy copies per layer, each a strided
copy of Hkv pieces: a partial block's snapshot, on the step's thread, took 0.37 ms that way at 64 streams of the 1B.
The arenas come as a tuple of byte views (Hkv, NB, BS, Dh x itemsize), whatever the pool's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _gather(keys, values, block, rows, out):  # pragma: no cover (compiled)
    """out (2, L, Hkv, rows, W) uint8 <- the first rows of `block` in every layer's keys and values (Hkv, NB, BS, W)."""
    for layer in range(len(keys)):
        k, v = keys[layer], values[layer]
        for h in range(k.shape[0]):
            for r in range(rows):
                out[0, layer, h, r, :] = k[h, block, r, :]
                out[1, layer, h, r, :] = v[h, block, r, :]


@njit(nogil=True, cache=True)
def _scatter(data, keys, values, block, rows):  # pragma: no cover (compiled)
    """The reverse of _gather: data (2, L, Hkv, rows, W) uint8 into the first rows of `block`."""
    for layer in range(len(keys)):
        k, v = keys[layer], values[layer]
        for h in range(k.shape[0]):
            for r in range(rows):
                k[h, block, r, :] = data[0, layer, h, r, :]
                v[h, block, r, :] = data[1, layer, h, r, :]


def byte_views(arenas: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Each arena (Hkv, NB, BS, Dh) as bytes (Hkv, NB, BS, Dh x itemsize), for gather_rows and scatter_rows."""
    return tuple(a.view(np.uint8) for a in arenas)


def gather_rows(keys: tuple[np.ndarray, ...], values: tuple[np.ndarray, ...], block: int, rows: int,
                out: np.ndarray) -> None:
    """The first `rows` rows of `block`, every layer's keys then values, into out (bytes,) uint8, packed."""
    width = keys[0].shape[3]
    _gather(keys, values, block, rows, out.reshape(2, len(keys), keys[0].shape[0], rows, width))


def scatter_rows(data: np.ndarray, keys: tuple[np.ndarray, ...], values: tuple[np.ndarray, ...], block: int,
                 rows: int) -> None:
    """gather_rows' bytes (bytes,) uint8 back into the first `rows` rows of `block`."""
    width = keys[0].shape[3]
    _scatter(data.reshape(2, len(keys), keys[0].shape[0], rows, width), keys, values, block, rows)
