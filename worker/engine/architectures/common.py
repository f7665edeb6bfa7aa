"""Helpers every architecture module shares: tensor lookup with clear errors and shape checks.

A projection here is an (out, in) float array or a QuantizedMatrix (the file's own blocks); neither is rewritten
at load: what used to be folded into the weights (norms, the query scale, fused rows, the RoPE row order) is done
on the activations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.engine.errors import ModelLoadError

Matrix = Any  # np.ndarray | QuantizedMatrix


def take(tensors: dict[str, Any], name: str, shape: tuple[int, ...], path: str) -> Matrix:
    """Fetch a tensor by name and check its shape; a missing or misshapen tensor is a ModelLoadError."""
    array = tensors.get(name)
    if array is None:
        raise ModelLoadError(path, f"tensor {name} is missing")
    if tuple(array.shape) != shape:
        raise ModelLoadError(path, f"tensor {name} has shape {tuple(array.shape)}, expected {shape}")
    return array


def unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (adjacent-pair RoPE) of an (out, in) float array (half-rotation order)."""
    out_dim = weight.shape[0]
    head_dim = out_dim // n_heads
    # GGUF row order per head is (i, a) for pair i, member a; the half-rotation order is (a, i).
    order = np.arange(out_dim).reshape(n_heads, head_dim // 2, 2).swapaxes(1, 2).reshape(out_dim)  # (out,)
    return np.ascontiguousarray(weight[order])  # (out, in)
