"""Sentence embeddings: pooled final-normed hidden states."""

from __future__ import annotations

from typing import Literal

import numpy as np

from worker.engine.forward_batch import BatchEntry
from worker.engine.kv_pool import KVPool
from worker.engine.model import Model

Pooling = Literal["mean", "last"]


def embed(model: Model, token_ids: list[int], *, pooling: Pooling = "mean", normalize: bool = True) -> np.ndarray:
    """One embedding (D,) for a token sequence: mean (or last-token) pooling, L2-normalised by default."""
    if not token_ids:
        raise ValueError("cannot embed an empty input")
    pool = KVPool(model.config, n_blocks=max(2, -(-len(token_ids) // 16)), block_size=16,
                  enable_prefix_caching=False)  # a scratch pool: nothing is kept
    pool.ensure(0, len(token_ids))
    hidden = model.forward([BatchEntry(0, np.asarray(token_ids), 0, output="hidden")], pool)[0]  # (T, D)
    assert hidden is not None
    vector = hidden.mean(axis=0) if pooling == "mean" else hidden[-1]  # (D,)
    if normalize:
        norm = float(np.linalg.norm(vector))
        vector = vector / norm if norm > 0 else vector  # (D,)
    return vector.astype(np.float32)
