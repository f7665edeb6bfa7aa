"""The compiled kernels' threading set-up, shared by kernels.py and block_kernels.py (a leaf: it imports no kernel).

Parallel kernels prefer numba's OpenMP layer (kernels.py says why); launches go through one process-wide lock,
because numba's `workqueue` layer must not be entered by two threads at once. Every compiled entry point is
`nogil`: while a step's kernels run, the worker's other threads (job feeder, publisher, cancel listener,
heartbeat) run too, instead of waiting for the kernel to return the GIL. The environment and the layer's
priority are set on import, before the first parallel call.
"""

from __future__ import annotations

import os
import threading

import numba

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # read when numba first loads libgomp (at the first launch)
numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]  # before the first parallel call
launch_lock = threading.Lock()  # workqueue is not re-entrant across threads: every parallel launch holds it


def set_threads(count: int) -> None:
    """Threads the parallel kernels use (at most the cores numba saw at start-up)."""
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))
