"""How a KV arena lays out its blocks: head-major within groups of blocks that each fill one 2 MiB page.

An arena (one layer's keys or values) is (NG, Hkv, G, BS, Dh): NG groups of G blocks, each group head-major. It is an
anonymous mapping of its own (zeros the kernel commits on first write, whatever the C library's allocator would have
reused), with transparent huge pages asked for, so memory is committed 2 MiB at a time; a group is 2 MiB (aligned to
one), so the first token written commits one page of each arena. Wholly head-major arenas
(Hkv, NB, BS, Dh) had a page in every head's region committed by the first block written: 448 MiB of the synthetic
1B for one token, in a 2 GiB pool (AnonHugePages), 58 ms of zeroing in that write. Wholly block-major arenas
(NB, Hkv, BS, Dh) commit as little, but a head's rows of consecutive blocks are then 4 KiB runs a block apart (a decode
step of 8 x 2,000 positions of the 1B took 147 against 125-134 ms in one measurement, Xeon); inside a group, one
head's rows of up to G consecutive blocks are one run, as before.
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Any

import numpy as np

GROUP_BYTES = 2 << 20  # one transparent huge page on x86-64 and (4 KiB base pages) arm64


def blocks_per_group(n_kv_heads: int, block_size: int, head_dim: int, dtype: Any) -> int:
    """Blocks of one arena that fill GROUP_BYTES (at least 1)."""
    return max(1, GROUP_BYTES // (n_kv_heads * block_size * head_dim * np.dtype(dtype).itemsize))


def new_arena(n_blocks: int, n_kv_heads: int, block_size: int, head_dim: int, dtype: Any) -> np.ndarray:
    """Zeros (NG, Hkv, G, BS, Dh) holding at least n_blocks blocks, the first group aligned to GROUP_BYTES (the
    pages stay uncommitted until written)."""
    group = blocks_per_group(n_kv_heads, block_size, head_dim, dtype)
    shape = (-(-n_blocks // group), n_kv_heads, group, block_size, head_dim)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    mapping = mmap.mmap(-1, nbytes + GROUP_BYTES)  # anonymous: zeros, committed page by page as they are written
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            mapping.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(mapping, np.uint8)  # (bytes + 2 MiB,): the slack around the aligned start: unwritten
    start = -raw.ctypes.data % GROUP_BYTES
    return raw[start : start + nbytes].view(dtype).reshape(shape)  # (NG, Hkv, G, BS, Dh)


def block_view(arena: np.ndarray, block: int) -> np.ndarray:
    """One block of an arena (NG, Hkv, G, BS, Dh): a strided (Hkv, BS, Dh) view."""
    group = arena.shape[2]
    return arena[block // group, :, block % group]  # (Hkv, BS, Dh)


def group_bytes(arena: np.ndarray) -> int:
    """Bytes of one group of blocks of an arena (NG, Hkv, G, BS, Dh)."""
    return arena[0].nbytes
