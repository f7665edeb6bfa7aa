"""This machine's memory read bandwidth, for putting a decode rate beside it: a compiled parallel sum over 1 GiB
(far larger than any cache), best of --repeats, with one thread and with every core. The sum is of float32 with
fastmath, so LLVM keeps several independent vector accumulators and the loop streams at the memory's speed (the
uint64 sum it replaced ran one dependent chain and measured the core, 10 GB/s on an AMD EPYC where llama-server
itself read 27 GB/s).

Run: python bench/memory_bandwidth.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange

GIB = 1 << 30


@njit(parallel=True, nogil=True, fastmath=True, cache=False)
def _parallel_sum(values: np.ndarray, parts: int) -> float:  # pragma: no cover (compiled)
    """The sum of values (float32), read in `parts` contiguous pieces, one a thread (reassociated: vectorized)."""
    size = values.size // parts
    totals = np.zeros(parts, np.float32)  # (parts,)
    for part in prange(parts):
        total = np.float32(0.0)
        for i in range(part * size, (part + 1) * size):
            total += values[i]
        totals[part] = total
    return totals.sum()


def read_bandwidth_gbs(repeats: int = 5) -> dict[int, float]:
    """GB/s read by 1 thread and by every numba thread: {threads: best GB/s}."""
    words = np.ones(GIB // 4, np.float32)  # (GiB/4,) committed before timing
    result = {}
    for threads in sorted({1, numba.get_num_threads()}):
        numba.set_num_threads(threads)
        _parallel_sum(words, threads)
        best = min(_timed(words, threads) for _ in range(repeats))
        result[threads] = words.nbytes / best / 1e9
    numba.set_num_threads(max(result))
    return result


def _timed(words: np.ndarray, parts: int) -> float:
    """Seconds one parallel sum takes."""
    started = time.perf_counter()
    _parallel_sum(words, parts)
    return time.perf_counter() - started


def main() -> None:
    """Print the read bandwidth per thread count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for threads, gbs in read_bandwidth_gbs(args.repeats).items():
        print(f"{threads} thread{'s' if threads > 1 else ''}: {gbs:.1f} GB/s")


if __name__ == "__main__":
    main()
