"""The integer K-quant matmul alone (interleaved_k_matmul.interleaved_k_matmul) on the Llama-3.2-1B shapes, random
Q4_K and Q6_K data (interleaved as a load holds them), at N rows of x: ms per call and multiply-adds per second
(min-max of --repeats), per shape and row count.

Run: PYTHONPATH=. python bench/int_matmul.py [--rows 1,16,64,256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tests.support.quant_data import random_blocks
from worker.engine.kernels import interleaved_k_matmul
from worker.engine.weights.interleaved_k_blocks import interleave_k
from worker.engine.weights.k_blocks import decode_k_blocks

SHAPES = (("Q4_K", 3072, 2048), ("Q4_K", 16384, 2048), ("Q6_K", 2048, 8192), ("Q4_K", 2048, 8192))  # (out, in)


def main() -> None:
    """Print ms per call and G multiply-adds per second for each shape and row count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,64,256")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    interleaved_k_matmul.warm()
    matrices = [(kind, interleave_k(decode_k_blocks(random_blocks(kind, out, cols, rng), kind, (out, cols))))
                for kind, out, cols in SHAPES]
    print(f"{'kind':>5} {'shape':>12} {'rows':>5} {'ms min-max':>16} {'GMAC/s best':>12}")
    for n in (int(r) for r in args.rows.split(",")):
        for kind, blocks in matrices:
            x = rng.standard_normal((n, blocks.shape[1])).astype(np.float32)  # (N, in)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                interleaved_k_matmul.interleaved_k_matmul(x, blocks)  # (N, out)
                times.append(time.perf_counter() - start)
            macs = n * blocks.shape[0] * blocks.shape[1]
            print(f"{kind:>5} {blocks.shape[0]:>6}x{blocks.shape[1]:<5} {n:>5} "
                  f"{min(times) * 1e3:>7.2f}-{max(times) * 1e3:<8.2f} {macs / min(times) / 1e9:>12.1f}")


if __name__ == "__main__":
    main()
