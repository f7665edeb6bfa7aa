"""KV pool memory as the kernel sees it: which pages of an arena are resident, and a pool shaped like a real model's."""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
from typing import Any

import numpy as np

from worker.engine.kv.pool import KVPool


def resident_bytes(array: np.ndarray) -> int:
    """Bytes of the array's pages that are in memory (mincore; Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    first = array.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    pages = -(-(array.ctypes.data + array.nbytes - first) // mmap.PAGESIZE)
    vector = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(pages * mmap.PAGESIZE), vector) == 0
    return sum(v & 1 for v in vector) * mmap.PAGESIZE


def one_b_shaped_pool(engine: Any, n_blocks: int = 2048) -> KVPool:
    """A Llama-3.2-1B-shaped pool of two layers (8 KV heads of 64, blocks of 32: 2,048 blocks are 64 MiB arenas),
    over any engine's config."""
    return KVPool(dataclasses.replace(engine.model.config, n_kv_heads=8, head_dim=64, n_layers=2), n_blocks)
