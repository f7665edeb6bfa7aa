"""Sentence embeddings: pooled final-normed hidden states."""

from __future__ import annotations

from typing import Literal

import numpy as np

from worker.engine.model import BatchEntry, Model

Pooling = Literal["mean", "last"]


def embed(model: Model, token_ids: list[int], *, pooling: Pooling = "mean", normalize: bool = True) -> np.ndarray:
    """One embedding (D,) for a token sequence: mean (or last-token) pooling, L2-normalised by default."""
    if not token_ids:
        raise ValueError("cannot embed an empty input")
    hidden = model.forward([BatchEntry(np.asarray(token_ids), model.new_cache(), output="hidden")])[0]  # (T, D)
    assert hidden is not None
    vector = hidden.mean(axis=0) if pooling == "mean" else hidden[-1]  # (D,)
    if normalize:
        norm = float(np.linalg.norm(vector))
        vector = vector / norm if norm > 0 else vector  # (D,)
    return vector.astype(np.float32)
