"""The block-code matmul kernel alone: SmolLM2-135M's matrix shapes, random 4-bit codes, at N rows of x.

Every layer has its own matrices (30 layers and the output head, 135M weights), so each call reads its codes from
memory as a decode step does. Prints ms per pass over all matrices (min-max of --repeats) per row count, and the
float32 BLAS chain over the same shapes in the same run for comparison.
Run: python bench/block_matmul.py [--rows 1,4,8,16,24,32] [--repeats 4]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")  # as the worker processes run (llmfleet/cli.py)

import argparse
import time

import numpy as np

from worker.engine.kernels import float_matmul

LAYER_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (out, in): fused QKV, O, gate+up, down
HEAD_SHAPE = (49152, 576)
GROUP = 32


def _matrices(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Codes, scales and offsets of every matrix of the model, distinct per layer."""
    shapes = [shape for _ in range(30) for shape in LAYER_SHAPES] + [HEAD_SHAPE]
    return [(rng.integers(0, 16, shape, dtype=np.uint8),  # (out, in)
             rng.uniform(0.01, 0.1, (shape[0], shape[1] // GROUP)).astype(np.float32),  # (out, in/G)
             rng.uniform(-0.5, 0.5, (shape[0], shape[1] // GROUP)).astype(np.float32))  # (out, in/G)
            for shape in shapes]


def _pass_ms(matrices: list, inputs: dict[int, np.ndarray], dense: list | None) -> float:
    """One pass over all matrices, block kernel (dense None) or float32 BLAS."""
    start = time.perf_counter()
    for i, (codes, scale, offset) in enumerate(matrices):
        x = inputs[codes.shape[1]]  # (N, in)
        if dense is None:
            float_matmul.block_matmul(x, codes, scale, offset)  # (N, out)
        else:
            _ = (dense[i] @ x.T).T  # (N, out)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    """Print block-kernel and BLAS ms per pass for each row count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8,16,24,32")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    matrices = _matrices(rng)
    dense = [(c.reshape(c.shape[0], -1, GROUP) * s[:, :, None] + m[:, :, None]).reshape(c.shape).astype(np.float32)
             for c, s, m in matrices]  # (out, in) each, 540 MB
    float_matmul.warm({GROUP})
    print(f"{'rows':>4} {'block codes ms':>16} {'float32 BLAS ms':>16}")
    for n in (int(r) for r in args.rows.split(",")):
        inputs = {cols: rng.standard_normal((n, cols)).astype(np.float32) for cols in (576, 1536)}  # (N, in)
        block, blas = [], []
        for _ in range(args.repeats):  # alternating, so background load hits both alike
            block.append(_pass_ms(matrices, inputs, None))
            blas.append(_pass_ms(matrices, inputs, dense))
        print(f"{n:>4} {min(block):7.1f}-{max(block):<8.1f} {min(blas):7.1f}-{max(blas):<8.1f}", flush=True)


if __name__ == "__main__":
    main()
