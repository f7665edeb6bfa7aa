"""Sentence embeddings: pooled final hidden states of an encoder (BERT, the pooling its file declares) or of a
causal LM (final-normed, mean or last)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from worker.engine.forward_batch import BatchEntry
from worker.engine.kv.pool import KVPool
from worker.engine.model import Model

Pooling = Literal["mean", "last"]
POOLING_TYPES = {1: "mean", 2: "cls", 3: "last"}  # GGUF {arch}.pooling_type -> pooling


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


def encoder_pooling(model: Model) -> str:
    """The pooling an encoder's file declares (mean when it declares none)."""
    return POOLING_TYPES.get(model.config.pooling_type, "mean")


def encode_batch(model: Model, inputs: list[list[int]], *, normalize: bool | Sequence[bool] = True) -> np.ndarray:
    """Embeddings (B, D) of many texts through an encoder in one forward, pooled as the file declares;
    `normalize` for all of them or one flag per input (texts of different requests share a forward)."""
    hidden, starts = model.encode(inputs)  # (N, D), (B+1,)
    hidden = np.asarray(hidden, dtype=np.float64)  # (N, D) pooled in float64: no drift with the batch size
    pooling = encoder_pooling(model)
    if pooling == "mean":
        vectors = np.add.reduceat(hidden, starts[:-1], axis=0) / np.diff(starts)[:, None]  # (B, D)
    elif pooling == "cls":
        vectors = hidden[starts[:-1]]  # (B, D)
    else:
        vectors = hidden[starts[1:] - 1]  # (B, D)
    flags = np.broadcast_to(np.asarray(normalize, dtype=bool), (len(inputs),))[:, None]  # (B, 1)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (B, 1)
    vectors = vectors / np.where(flags & (norms > 0), norms, 1.0)  # (B, D)
    return vectors.astype(np.float32)  # (B, D)
