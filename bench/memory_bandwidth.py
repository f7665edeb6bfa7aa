"""This machine's memory read bandwidth, for putting a decode rate beside it: a compiled parallel sum over 1 GiB
(far larger than any cache), best of --repeats, with one thread and with every core.

Run: python bench/memory_bandwidth.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange

GIB = 1 << 30


@njit(parallel=True, nogil=True, cache=False)
def _parallel_sum(words: np.ndarray, parts: int) -> int:  # pragma: no cover (compiled)
    """The sum of words (uint64), read in `parts` contiguous pieces, one a thread."""
    size = words.size // parts
    totals = np.zeros(parts, np.uint64)  # (parts,)
    for part in prange(parts):
        total = np.uint64(0)
        for i in range(part * size, (part + 1) * size):
            total += words[i]
        totals[part] = total
    return totals.sum()


def read_bandwidth_gbs(repeats: int = 5) -> dict[int, float]:
    """GB/s read by 1 thread and by every numba thread: {threads: best GB/s}."""
    words = np.ones(GIB // 8, np.uint64)  # (GiB/8,) committed before timing
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
