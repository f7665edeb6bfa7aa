"""Architecture registry: each module maps one GGUF architecture's tensors to TransformerWeights."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from worker.engine.architectures import llama, qwen2
from worker.engine.config import ModelConfig
from worker.engine.errors import ModelLoadError
from worker.engine.weights import TransformerWeights

WeightBuilder = Callable[[dict[str, np.ndarray], ModelConfig, str], TransformerWeights]

ARCHITECTURES: dict[str, WeightBuilder] = {
    "llama": llama.build_weights,
    "qwen2": qwen2.build_weights,
}


def build_weights(tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> TransformerWeights:
    """Build the weights for the file's architecture, or raise ModelLoadError if it is not supported."""
    builder = ARCHITECTURES.get(config.architecture)
    if builder is None:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise ModelLoadError(path, f"unsupported architecture {config.architecture!r} (supported: {supported})")
    return builder(tensors, config, path)
