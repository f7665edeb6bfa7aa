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
    return finish_pool(pool_chunk(None, hidden, pooling), len(token_ids), pooling, normalize)  # (D,)


def pool_chunk(pooled: np.ndarray | None, hidden: np.ndarray, pooling: Pooling) -> np.ndarray:
    """Fold one prefill chunk's final hidden states (T, D) into a running pool: a sum (mean) or the last row."""
    part = hidden.sum(axis=0) if pooling == "mean" else hidden[-1]  # (D,)
    return part if pooled is None or pooling != "mean" else pooled + part  # (D,)


def finish_pool(pooled: np.ndarray, n_tokens: int, pooling: Pooling, normalize: bool) -> np.ndarray:
    """The embedding (D,) from a running pool over n_tokens tokens, L2-normalised when asked."""
    vector = pooled / n_tokens if pooling == "mean" else pooled  # (D,)
    if normalize:
        norm = float(np.linalg.norm(vector))
        vector = vector / norm if norm > 0 else vector  # (D,)
    return vector.astype(np.float32)  # (D,)
