"""What an architecture is: a loader (GGUF tensors -> weights) and a block function over the engine's ops."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from worker.engine.formats.config import ModelConfig
from worker.engine.forward_batch import ForwardBatch
from worker.engine.lora_targets import LoraTarget
from worker.engine.ops import Array


class Architecture(Protocol):
    """One model family. Everything numeric goes through worker.engine.ops; weights come from `load`."""

    name: str
    metadata_keys: frozenset[str]  # the `{name}.*` GGUF keys it honours (file_fields.py refuses the others)

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> Any:
        """Map GGUF tensors to this architecture's weights (folding and fusing passes included)."""

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """The projections LoRA adapters may target, with the load transforms of their base weights."""

    def embed(self, weights: Any, tokens: Array) -> Array:
        """Token ids (N,) to the first hidden states (N, D)."""

    def block(self, weights: Any, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """One transformer block over the step's hidden states x (N, D); returns the new (N, D)."""

    def final_hidden(self, weights: Any, x: Array) -> Array:
        """The last hidden states after the final norm (M, D)."""

    def logits(self, weights: Any, hidden: Array) -> Array:
        """Output projection of final hidden states (M, D) to logits (M, V)."""


class Encoder(Protocol):
    """An embedding-only model family (BERT): whole texts in one forward, no KV cache, no logits."""

    name: str
    encoder: bool  # True
    metadata_keys: frozenset[str]  # the `{name}.*` GGUF keys it honours

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> Any:
        """Map GGUF tensors to this architecture's weights."""

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """None: encoders take no adapters."""

    def encode(self, weights: Any, tokens: Array, positions: Array, starts: Array) -> Array:
        """Final hidden states (N, D) of texts laid end to end (text i in rows starts[i]..starts[i+1]-1)."""
