"""Helpers every architecture module shares: tensor lookup with clear errors, shape checks, fusing."""

from __future__ import annotations

import numpy as np

from worker.engine.errors import ModelLoadError


def take(tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...], path: str) -> np.ndarray:
    """Fetch a tensor by name and check its shape; a missing or misshapen tensor is a ModelLoadError."""
    array = tensors.get(name)
    if array is None:
        raise ModelLoadError(path, f"tensor {name} is missing")
    if array.shape != shape:
        raise ModelLoadError(path, f"tensor {name} has shape {array.shape}, expected {shape}")
    return array


def fuse_rows(*matrices: np.ndarray) -> np.ndarray:
    """Stack (out_i, in) matrices into one C-contiguous (sum out_i, in) matrix."""
    return np.ascontiguousarray(np.concatenate(matrices, axis=0), dtype=np.float32)  # (sum out_i, in)


def unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (adjacent-pair RoPE) so RoPE can rotate halves (NEOX form)."""
    out_dim, in_dim = weight.shape
    head_dim = out_dim // n_heads
    # GGUF row order per head is (i, a) for pair i, member a; the half-rotation order is (a, i).
    return weight.reshape(n_heads, head_dim // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)  # (out, in)


def fold_norm(matrix: np.ndarray, norm_weight: np.ndarray) -> np.ndarray:
    """Fold a norm's per-feature weight into the input columns of the (out, in) matrix that follows it."""
    return np.ascontiguousarray(matrix * norm_weight[None, :], dtype=np.float32)  # (out, in)
