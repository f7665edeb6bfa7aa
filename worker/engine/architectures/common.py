"""Helpers every architecture module shares: tensor lookup with clear errors, shape checks, fusing.

A projection here is an (out, in) float32 array or a PendingLinear (a quantized tensor's recipe, built after
loading: quantized.py); every transform applies to both alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from worker.engine.errors import ModelLoadError
from worker.engine.weights.quantized import PendingLinear, fuse_pending_rows

Matrix = Any  # np.ndarray | PendingLinear


@dataclass(frozen=True, kw_only=True)
class Arrays:
    """A block's (or a block part's) weights: `nbytes` counts every array field (nested parts included)."""

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays in the block."""
        values = (getattr(self, f.name) for f in fields(self))
        return sum(int(v.nbytes) for v in values if v is not None)


def take(tensors: dict[str, Any], name: str, shape: tuple[int, ...], path: str) -> Matrix:
    """Fetch a tensor by name and check its shape; a missing or misshapen tensor is a ModelLoadError."""
    array = tensors.get(name)
    if array is None:
        raise ModelLoadError(path, f"tensor {name} is missing")
    if tuple(array.shape) != shape:
        raise ModelLoadError(path, f"tensor {name} has shape {array.shape}, expected {shape}")
    return array


def dense(matrix: Matrix) -> np.ndarray:
    """The float32 form of a projection (a quantized one dequantized: the fallback of mixed fusing)."""
    return matrix.dequantize() if isinstance(matrix, PendingLinear) else matrix


def fuse_rows(*matrices: Matrix) -> Matrix:
    """Stack (out_i, in) matrices into one C-contiguous (sum out_i, in) matrix (block-coded when all parts are)."""
    if all(isinstance(m, PendingLinear) for m in matrices):
        fused = fuse_pending_rows(matrices)
        if fused is not None:
            return fused
    return np.ascontiguousarray(np.concatenate([dense(m) for m in matrices], axis=0), dtype=np.float32)  # (sum out_i, in)


def unpermute_rope_rows(weight: Matrix, n_heads: int) -> Matrix:
    """Undo llama.cpp's Q/K row permutation (adjacent-pair RoPE) so RoPE can rotate halves (NEOX form)."""
    out_dim = weight.shape[0]
    head_dim = out_dim // n_heads
    # GGUF row order per head is (i, a) for pair i, member a; the half-rotation order is (a, i).
    order = np.arange(out_dim).reshape(n_heads, head_dim // 2, 2).swapaxes(1, 2).reshape(out_dim)  # (out,)
    return take_rows(weight, order)  # (out, in)


def scale_rows(matrix: Matrix, factor: np.float32) -> Matrix:
    """Every output row multiplied by one factor."""
    return matrix.scale_rows(factor) if isinstance(matrix, PendingLinear) else matrix * factor


def fold_norm(matrix: Matrix, norm_weight: np.ndarray) -> Matrix:
    """Fold a norm's per-feature weight into the input columns of the (out, in) matrix that follows it."""
    if isinstance(matrix, PendingLinear):
        return matrix.fold_columns(norm_weight)
    return np.ascontiguousarray(matrix * norm_weight[None, :], dtype=np.float32)  # (out, in)


def take_rows(matrix: Matrix, order: np.ndarray) -> Matrix:
    """The rows of an (out, in) matrix in the order of the index array `order` (out,)."""
    if isinstance(matrix, PendingLinear):
        return matrix.permute_rows(order)
    return np.ascontiguousarray(matrix[order])  # (out, in)
