"""The compiled kernels' threading set-up, shared by layer_kernels.py and float_matmul.py (a leaf: it imports no kernel).

Parallel kernels prefer numba's OpenMP layer (layer_kernels.py says why); launches go through one process-wide lock,
because numba's `workqueue` layer must not be entered by two threads at once. Every compiled entry point is
`nogil`: while a step's kernels run, the worker's other threads (job feeder, publisher, cancel listener,
heartbeat) run too, instead of waiting for the kernel to return the GIL. The layer's priority is set on import
and the threads' spin by a model load (`set_spin`), both before the first parallel call. Kernels take their vector
scratch from a 64-byte boundary here (`aligned_bytes`, `aligned_floats`), and the matmuls share a launch's tasks
out through a queue (`guided_bounds`, `take_next`). A kernel factory's closures keep numba cache indexes of their
own (`own_cache_index`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numba
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

SPIN_WITH_BLAS = 10000  # OpenMP spin rounds when BLAS threads share the step (an encoder's matmuls)
SPIN_ALONE = 300000  # libgomp's own default: bridges the Python between a decoder step's launches
_SPIN_GIVEN = "GOMP_SPINCOUNT" in os.environ  # an operator's value is kept
numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]  # before the first parallel call
launch_lock = threading.Lock()  # workqueue is not re-entrant across threads: every parallel launch holds it
FINEST_SPLIT = 64  # a matmul launch's last tasks are 1/64 of its items (guided_bounds)
Function = TypeVar("Function", bound=Callable[..., Any])


def own_cache_index(constant: object) -> Callable[[Function], Function]:
    """A decorator, under njit(cache=True), naming a closure a kernel factory makes apart by the factory's `constant`,
    so it keeps a numba cache index of its own. Closures of one factory share a qualname, hence an index: two
    processes compiling different ones at once could both give their code one data file, and a later load would find
    the other closure's code under an identical signature (numba checks a cached entry's signature, not its
    closure)."""

    def rename(function: Function) -> Function:
        function.__qualname__ = f"{function.__qualname__}_{constant}"
        return function

    return rename


def set_spin(with_blas: bool) -> None:
    """How long idle OpenMP threads spin before they sleep, unless GOMP_SPINCOUNT was given; libgomp reads it once,
    at numba's first parallel launch, so a model load sets it before then. A decoder's steps are launches with a
    little Python between them: a helper thread asleep at each launch is woken late when the gateway, Redis or
    the publisher hold its core (a served 1B stream took 10-20% longer). An encoder's BLAS threads alternate with
    the kernels': spinning helpers would take their cores (a step 278 ms against 72), so it spins briefly."""
    if not _SPIN_GIVEN:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_WITH_BLAS if with_blas else SPIN_ALONE)


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


@intrinsic
def take_next(typingctx: Any, counter: Any) -> Any:
    """counter[0] += 1 as one atomic step, returning the value before: the next task of a launch's shared queue."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.atomic_rmw("add", data, context.get_constant(types.int64, 1), "monotonic")

    return types.int64(counter), codegen


@njit(inline="always", cache=True)
def guided_bounds(items, threads):  # pragma: no cover (compiled)
    """Task bounds over `items` (task i: items bounds[i] .. bounds[i + 1] - 1) for `threads` taking tasks in turn
    from a shared queue (take_next): each task 1/(2 threads) of what is left, at least 1/FINEST_SPLIT of the
    whole, so that the threads start on long runs and end on short ones. A thread the kernel shares its core with
    (the gateway, Redis, the worker's publisher) then delays one task, not half the launch: the other thread
    takes the rest (a static split made the whole launch wait for the held-up half)."""
    smallest = max(1, items // FINEST_SPLIT)  # every task but the last holds this many: at most 2 FINEST_SPLIT + 1
    bounds = np.empty(min(items, 2 * FINEST_SPLIT + 1) + 1, np.int64)
    bounds[0] = 0
    count, done = 0, 0
    while done < items:
        size = max(smallest, (items - done + 2 * threads - 1) // (2 * threads))
        done = min(items, done + size)
        count += 1
        bounds[count] = done
    return bounds[: count + 1]
