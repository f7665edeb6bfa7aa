"""The `qwen35moe` architecture (Qwen3.5-35B-A3B, 122B-A10B; llama.cpp's qwen35moe.cpp): Qwen3.5's gated delta-net
and gated attention layers (qwen35.py), each followed by a routed FFN (Qwen3-MoE's: softmax gating, the top k
renormalised, qwen3moe.py) plus a shared expert every token runs, its SwiGLU output scaled by sigmoid(x . g) with
one gate weight vector g; the routed and shared outputs are summed before the residual."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import fold_norm, fuse_rows, take
from worker.engine.architectures.qwen3moe import EXPERT_KEYS, Qwen3MoE, RoutedFFN
from worker.engine.architectures.qwen35 import HYBRID_KEYS, Qwen35
from worker.engine.errors import ModelLoadError
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.file_fields import DECODER_KEYS
from worker.engine.forward_batch import ForwardBatch
from worker.engine.lora_targets import LoraTarget
from worker.engine.ops import Array


@dataclass(frozen=True, kw_only=True)
class SharedRoutedFFN(RoutedFFN):
    """A routed FFN beside a gated shared expert."""

    shared_gate_up: Array  # (2Fs, D) the shared expert's fused gate/up, post_attention_norm folded in
    shared_down: Array  # (D, Fs)
    shared_gate: Array  # (1, D) float32: its gate's weight vector, post_attention_norm folded in


class Qwen35MoE(Qwen35, Qwen3MoE):
    """Qwen3.5's layers with Qwen3-MoE's routed FFN and a sigmoid-gated shared expert."""

    name = "qwen35moe"
    metadata_keys = DECODER_KEYS | HYBRID_KEYS | EXPERT_KEYS | {"expert_shared_feed_forward_length"}
    ffn_norm_name = "post_attention_norm"

    def load_ffn(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> SharedRoutedFFN:
        """Block i's router, stacked experts and shared expert."""
        d, fs, p = config.d_model, config.d_ff_shared, f"blk.{i}."
        if fs <= 0:
            raise ModelLoadError(path, f"{config.architecture} needs expert_shared_feed_forward_length > 0")
        norm = take(tensors, p + "post_attention_norm.weight", (d,), path)  # (D,)
        gate = np.asarray(take(tensors, p + "ffn_gate_inp_shexp.weight", (d,), path), np.float32)[None, :]  # (1, D)
        return SharedRoutedFFN(
            **self.load_feed_forward(tensors, config, i, path),
            shared_gate_up=ops.weight(fold_norm(fuse_rows(take(tensors, p + "ffn_gate_shexp.weight", (fs, d), path),
                                                          take(tensors, p + "ffn_up_shexp.weight", (fs, d), path)),
                                                norm)),  # (2Fs, D)
            shared_down=ops.weight(take(tensors, p + "ffn_down_shexp.weight", (d, fs), path)),  # (D, Fs)
            shared_gate=ops.asarray(fold_norm(gate, norm)),  # (1, D)
        )

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """None: its FFNs are experts and its mixers of two kinds."""
        return ()

    def feed_forward(self, weights: Any, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """The routed FFN plus the gated shared expert, pre-normed and residual: updates and returns x (N, D)."""
        cfg, w = weights.config, weights.layers[layer].ffn
        normed = ops.rms_normalize(x, cfg.rms_eps)  # (N, D)
        shared = ops.linear(ops.swiglu(ops.linear(normed, w.shared_gate_up)), w.shared_down)  # (N, D)
        gate = ops.linear(normed, w.shared_gate)  # (N, 1)
        shared *= 1.0 / (1.0 + np.exp(-gate))  # (N, D) times sigmoid(gate)
        x += self.routed(cfg, w, normed) + shared  # (N, D)
        return x
