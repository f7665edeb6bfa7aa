"""The compiled kernels' threading set-up, shared by kernels.py and block_kernels.py (a leaf: it imports no kernel).

Parallel kernels prefer numba's OpenMP layer (kernels.py says why); launches go through one process-wide lock,
because numba's `workqueue` layer must not be entered by two threads at once. Every compiled entry point is
`nogil`: while a step's kernels run, the worker's other threads (job feeder, publisher, cancel listener,
heartbeat) run too, instead of waiting for the kernel to return the GIL. The environment and the layer's
priority are set on import, before the first parallel call. Kernels take their vector scratch from a 64-byte
boundary here (`aligned_bytes`, `aligned_floats`).
"""

from __future__ import annotations

import os
import threading

import numba
import numpy as np
from numba import njit

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # read when numba first loads libgomp (at the first launch)
numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]  # before the first parallel call
launch_lock = threading.Lock()  # workqueue is not re-entrant across threads: every parallel launch holds it


def set_threads(count: int) -> None:
    """Threads the parallel kernels use (at most the cores numba saw at start-up)."""
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))


@njit(inline="always", cache=True)
def aligned_bytes(count):  # pragma: no cover (compiled)
    """An uninitialised uint8 scratch of `count` bytes from a 64-byte boundary (numba aligns arrays to 32 bytes; a
    512-bit load across two cache lines costs two)."""
    raw = np.empty(count + 64, np.uint8)
    skip = (64 - raw.ctypes.data % 64) % 64
    return raw[skip : skip + count]


@njit(inline="always", cache=True)
def aligned_floats(count):  # pragma: no cover (compiled)
    """An uninitialised float32 scratch of `count` values from a 64-byte boundary (as aligned_bytes)."""
    raw = np.empty(count + 16, np.float32)
    skip = ((64 - raw.ctypes.data % 64) % 64) // 4
    return raw[skip : skip + count]
