"""The compiled kernels' threading set-up, shared by kernels.py and block_kernels.py (a leaf: it imports no kernel).

Parallel kernels prefer numba's OpenMP layer (kernels.py says why); launches go through one process-wide lock,
because numba's `workqueue` layer must not be entered by two threads at once. The environment and the layer's
priority are set on import, before the first parallel call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numba

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # read when numba first loads libgomp (at the first launch)
numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]  # before the first parallel call
launch_lock = threading.Lock()  # workqueue is not re-entrant across threads: every parallel launch holds it


def set_threads(count: int) -> None:
    """Threads the parallel kernels use (at most the cores numba saw at start-up)."""
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))


SINGLE_THREAD_ROWS = 2  # a step of at most this many rows runs its kernels on one thread (threads_for_step)


@contextmanager
def threads_for_step(rows: int) -> Iterator[None]:
    """The kernels of a step of `rows` rows, within this block, on one thread when rows <= SINGLE_THREAD_ROWS: such
    a step streams the weights once, and one core reads memory as fast as two here, so the other core is left to
    the worker's I/O threads, the gateway and Redis instead of stalling the step. Results do not change: every
    kernel gives each output to one thread in a fixed order."""
    before = numba.get_num_threads()
    if rows > SINGLE_THREAD_ROWS or before == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)
