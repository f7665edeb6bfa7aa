"""The `qwen2` architecture: llama's block with Q/K/V biases and NEOX RoPE (rows not permuted by the converter)."""

from __future__ import annotations

import numpy as np

from worker.engine.architectures import llama
from worker.engine.config import ModelConfig
from worker.engine.weights import TransformerWeights


def build_weights(tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> TransformerWeights:
    """Qwen2 tensors are llama's plus biases, with Q/K already in half-rotation order."""
    return llama.build_weights(tensors, config, path, rope_rows_permuted=False)
