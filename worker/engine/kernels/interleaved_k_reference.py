"""interleaved_k_matmul's arithmetic (its docstring's reduction) in numpy, step by step: the tests' reference."""

from __future__ import annotations

import numpy as np

from worker.engine.kernels.int8_spans import fma32
from worker.engine.kernels.k_activations import reference_quantize
from worker.engine.weights.interleaved_k_blocks import InterleavedK
from worker.engine.weights.quant_blocks import QK_K


def reference_matmul(x: np.ndarray, blocks: InterleavedK) -> np.ndarray:
    """interleaved_k_matmul's arithmetic in numpy, step by step: (N, R)."""
    rows_q = reference_quantize(x)
    q = rows_q.q.astype(np.int64)  # (N, C)
    n_rows, cols = q.shape
    supers = cols // QK_K
    codes = blocks.code_rows().astype(np.int64)  # (R, C)
    scales = blocks.row_lanes(blocks.scales, np.arange(blocks.out)).reshape(blocks.out, -1)  # (R, S * V)
    group = 16 if blocks.kind == "Q6_K" else 32
    sums = np.einsum("rgc,kgc->rkg", codes.reshape(blocks.out, -1, group), q.reshape(n_rows, -1, group))  # (R, N, g)
    if blocks.kind == "Q6_K":
        sums = sums + rows_q.offsets.astype(np.int64).reshape(n_rows, -1, 2).sum(axis=2)[None]  # -32 S16
    weighted = (sums * scales.astype(np.int64)[:, None, :]).reshape(blocks.out, n_rows, supers, 4, -1).sum(axis=4)  # I
    d = blocks.row_lanes(blocks.d_values()[:, :, None], np.arange(blocks.out)).reshape(blocks.out, supers)  # (R, S)
    t = (weighted.astype(np.float32) * d[:, None, :, None]).astype(np.float32)  # (R, N, S, 4)
    if blocks.kind != "Q6_K":
        assert blocks.mins is not None and blocks.dmin is not None
        m = blocks.row_lanes(blocks.mins, np.arange(blocks.out)).reshape(blocks.out, supers, 4, 2).astype(np.int64)
        s32 = rows_q.sums32.astype(np.int64).reshape(n_rows, supers, 4, 2)  # (N, S, h, b)
        mins = np.einsum("rshb,kshb->rksh", m, s32)  # (R, N, S, 4)
        dmin = blocks.row_lanes(blocks.dmin_values()[:, :, None], np.arange(blocks.out)).reshape(d.shape)  # (R, S)
        t = fma32(mins.astype(np.float32), -dmin[:, None, :, None], t)
    dx = rows_q.dx.reshape(n_rows, supers, 4)  # (N, S, 4)
    acc = np.zeros((blocks.out, n_rows), np.float32)  # (R, N)
    for s in range(supers):
        for h in range(4):
            acc = fma32(t[:, :, s, h], dx[None, :, s, h], acc)
    return np.ascontiguousarray(acc.T)  # (N, R)
