"""The MXFP4 integer matmul (mxfp4_matmul.mxfp4_matmul) against the Q4_0 one (interleaved_matmul.interleaved_matmul)
on one random (out, in) matrix of each, in the same run, calls alternating: ms per call (best of --repeats), the held
matrix's bytes read per second (GB/s), and MXFP4's time over Q4_0's, per row count of x.

Run: PYTHONPATH=. python bench/mxfp4_matmul.py [--shape 2880x2880] [--rows 1,16] [--repeats 30]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from tests.support.quant_data import random_blocks, random_mxfp4
from worker.engine.kernels import interleaved_matmul, mxfp4_matmul
from worker.engine.weights.interleaved_blocks import interleave
from worker.engine.weights.interleaved_mxfp4 import interleave_mxfp4
from worker.engine.weights.mxfp4_blocks import decode_mxfp4
from worker.engine.weights.quant_blocks import decode_block_codes


def main() -> None:
    """Print ms per call, GB/s and the MXFP4 / Q4_0 time ratio for each row count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2880x2880")
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    out, cols = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    q4_codes = decode_block_codes(random_blocks("Q4_0", out, cols, rng), "Q4_0", (out, cols))
    assert q4_codes is not None
    q4 = interleave(q4_codes)
    mx = interleave_mxfp4(decode_mxfp4(random_mxfp4(out, cols, rng, (118, 130)), (out, cols)))
    kernels: dict[str, tuple[Callable[[np.ndarray], np.ndarray], int]] = {
        "Q4_0": (lambda x: interleaved_matmul.interleaved_matmul(x, q4), q4.nbytes),
        "MXFP4": (lambda x: mxfp4_matmul.mxfp4_matmul(x, mx), mx.nbytes),
    }
    print(f"{'kind':>6} {'shape':>11} {'rows':>5} {'bytes/w':>8} {'ms best':>8} {'GB/s':>7} {'vs Q4_0':>8}")
    for n in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((n, cols)).astype(np.float32)  # (N, in)
        best = {name: float("inf") for name in kernels}
        for run, _ in kernels.values():
            run(x)  # compiled and cached before timing
        for _ in range(args.repeats):
            for name, (run, _) in kernels.items():
                start = time.perf_counter()
                run(x)  # (N, out)
                best[name] = min(best[name], time.perf_counter() - start)
        for name, (_, nbytes) in kernels.items():
            print(f"{name:>6} {out:>5}x{cols:<5} {n:>5} {nbytes / (out * cols):>8.3f} {best[name] * 1e3:>8.3f} "
                  f"{nbytes / best[name] / 1e9:>7.1f} {best[name] / best['Q4_0']:>8.2f}")


if __name__ == "__main__":
    main()
