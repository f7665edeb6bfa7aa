"""This machine's memory read bandwidth, for putting a decode rate beside it: the largest of 1 GiB of float32
(far larger than any cache) read in contiguous pieces, one a thread, best of --repeats, with one thread and with
every core. numpy's max is a vectorized streaming read that runs without the GIL, so the threads read at once.

A compiled numba sum it replaced ran at 4.5 GB/s a core (its reduction was not vectorized: it measured the core,
not the memory), 9 GB/s on 2 cores of an AMD EPYC where llama-server itself read 28 GB/s at one stream; this
probe reads 28 GB/s with one thread and 36 GB/s with two there (2026-11-27).

Run: python bench/memory_bandwidth.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

GIB = 1 << 30


def read_bandwidth_gbs(repeats: int = 5) -> dict[int, float]:
    """GB/s read by 1 thread and by one thread per core: {threads: best GB/s}."""
    values = np.ones(GIB // 4, np.float32)  # (GiB/4,) committed before timing
    result = {}
    for threads in sorted({1, os.cpu_count() or 1}):
        parts = np.array_split(values, threads)  # contiguous views, one a thread
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(np.max, parts))  # the threads started and the pages touched once
            best = min(_timed(pool, parts) for _ in range(repeats))
        result[threads] = values.nbytes / best / 1e9
    return result


def _timed(pool: ThreadPoolExecutor, parts: list[np.ndarray]) -> float:
    """Seconds one read of every part (all threads at once) takes."""
    started = time.perf_counter()
    list(pool.map(np.max, parts))
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
