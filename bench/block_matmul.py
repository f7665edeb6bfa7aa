"""The integer block matmul alone: SmolLM2-135M's matrix shapes as Q4_1 (its projections' type), at N rows of x.

Every layer has its own matrices (30 layers and the Q8_0 output head), so each call reads its blocks from memory
as a step does. Prints ms per pass over all matrices (min-max of --repeats) per row count, with the float32 BLAS
chain over the same shapes in the same run (alternating) for comparison.
Run: python bench/block_matmul.py [--rows 1,4,16,32,64,256] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")  # as the worker processes run (llmfleet/cli.py)

import argparse
import time

import gguf
import numpy as np
from gguf.quants import quantize

from worker.engine.quantized import QuantizedMatrix, dequantize_rows

LAYER_SHAPES = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))  # (out, in)
HEAD_SHAPE = (49152, 576)


def _matrices(rng: np.random.Generator) -> list[QuantizedMatrix]:
    """Every matrix of the model as raw blocks, distinct per layer (one layer quantized, then perturbed bytes)."""
    layer = [quantize(rng.standard_normal(s).astype(np.float32), gguf.GGMLQuantizationType.Q4_1) for s in LAYER_SHAPES]
    out = []
    for i in range(30):
        for shape, raw in zip(LAYER_SHAPES, layer):
            copy = raw.copy()  # (out, bytes): its own memory, as each layer's matrices are
            copy[:, 4:] ^= np.uint8(i)  # other codes, the same scales
            out.append(QuantizedMatrix(f"blk.{i}", "Q4_1", copy, shape))
    head = quantize(rng.standard_normal(HEAD_SHAPE).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    return out + [QuantizedMatrix("output", "Q8_0", head, HEAD_SHAPE)]


def _pass_ms(matrices: list[QuantizedMatrix], inputs: dict[int, np.ndarray], dense: list | None) -> float:
    """One pass over all matrices: integer kernels (dense None) or float32 BLAS."""
    start = time.perf_counter()
    for i, matrix in enumerate(matrices):
        x = inputs[matrix.shape[1]]  # (N, in)
        if dense is None:
            matrix.matmul(x)  # (N, out)
        else:
            _ = x @ dense[i].T  # (N, out)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    """Print integer-kernel and BLAS ms per pass for each row count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,16,32,64,256")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    matrices = _matrices(rng)
    dense = [dequantize_rows(m.raw, m.kind) for m in matrices]  # (out, in) each, float32
    print(f"{'rows':>4} {'integer ms':>16} {'float32 BLAS ms':>16}")
    for n in (int(r) for r in args.rows.split(",")):
        inputs = {cols: rng.standard_normal((n, cols)).astype(np.float32) for cols in (576, 1536)}  # (N, in)
        _pass_ms(matrices[:2], inputs, None)  # compiled before timing
        ints, blas = [], []
        for _ in range(args.repeats):  # alternating, so background load hits both alike
            ints.append(_pass_ms(matrices, inputs, None))
            blas.append(_pass_ms(matrices, inputs, dense))
        print(f"{n:>4} {min(ints):7.1f}-{max(ints):<8.1f} {min(blas):7.1f}-{max(blas):<8.1f}", flush=True)


if __name__ == "__main__":
    main()
