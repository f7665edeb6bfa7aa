"""The `qwen3moe` architecture (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (QK-norm) with a routed FFN
(llama.cpp's qwen3moe.cpp and build_moe_ffn): the router's softmax over the experts, the top k (k from
`expert_used_count`), their weights renormalised to sum 1, and the chosen experts' SwiGLU FFNs summed with those
weights (experts.py). The experts' tensors are stacked (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import Arrays, dense, fold_norm, fuse_rows, take, take_rows
from worker.engine.architectures.llama import AttentionWeights
from worker.engine.architectures.qwen3 import Qwen3
from worker.engine.errors import ModelLoadError
from worker.engine.experts import SOFTMAX, StackedExperts, combine, route
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.file_fields import DECODER_KEYS
from worker.engine.forward_batch import ForwardBatch
from worker.engine.lora_targets import LoraTarget
from worker.engine.ops import Array

EXPERT_KEYS = frozenset({"expert_count", "expert_used_count", "expert_feed_forward_length", "expert_weights_scale"})


@dataclass(frozen=True, kw_only=True)
class RoutedFFN(Arrays):
    """A routed FFN of stacked experts."""

    router: Array  # (E, D) float32, ffn_norm folded in
    router_bias: Array | None = None  # (E,) or None
    gate_up: StackedExperts | None = None  # rows (2F,) per expert: its gate rows, then its up rows; ffn_norm folded in
    gate: StackedExperts | None = None  # gate and up apart, where the file's kinds differ (rows F each)
    up: StackedExperts | None = None
    down: StackedExperts  # rows (D,) per expert, input F
    gate_up_bias: Array | None = None  # (E, 2F) each expert's gate then up biases (gpt-oss), or None
    down_bias: Array | None = None  # (E, D) or None


@dataclass(frozen=True, kw_only=True)
class RoutedLayer(AttentionWeights, RoutedFFN):
    """One block: attention, then a routed FFN of stacked experts."""


class Qwen3MoE(Qwen3):
    """Qwen3 with every block's FFN routed: softmax gating, renormalised top-k weights."""

    name = "qwen3moe"
    metadata_keys = DECODER_KEYS | EXPERT_KEYS
    layer_type = RoutedLayer
    gating = SOFTMAX
    normalize_weights = True
    ffn_norm_name = "ffn_norm"  # the norm before the routed FFN

    def load_feed_forward(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> dict[str, Any]:
        """Block i's router and stacked experts (RoutedLayer's fields)."""
        d, e, f, p = config.d_model, config.n_experts, expert_width(config, path), f"blk.{i}."
        if not 0 < config.n_experts_used <= e:
            raise ModelLoadError(path, f"expert_used_count {config.n_experts_used} is not within 1..{e}")
        ffn_norm = take(tensors, p + self.ffn_norm_name + ".weight", (d,), path)  # (D,)
        router = take(tensors, p + "ffn_gate_inp.weight", (e, d), path)  # (E, D)
        gate = take_stacked(tensors, p + "ffn_gate_exps.weight", (e, f, d), path)  # (E*F, D)
        up = take_stacked(tensors, p + "ffn_up_exps.weight", (e, f, d), path)  # (E*F, D)
        down = take_stacked(tensors, p + "ffn_down_exps.weight", (e, d, f), path)  # (E*D, F)
        parts: dict[str, Any] = {
            "router": ops.weight(fold_norm(np.asarray(dense(router), np.float32), ffn_norm)),  # (E, D) float32
            "down": StackedExperts(ops.weight(down), e, d),
        }
        if getattr(gate, "kind", "") == getattr(up, "kind", ""):  # one matrix: expert j's gate rows, then its up rows
            order = np.arange(2 * e * f).reshape(2, e, f).transpose(1, 0, 2).reshape(-1)  # (2EF,)
            parts["gate_up"] = StackedExperts(ops.weight(fold_norm(take_rows(fuse_rows(gate, up), order), ffn_norm)),
                                              e, 2 * f)
        else:
            parts["gate"] = StackedExperts(ops.weight(fold_norm(gate, ffn_norm)), e, f)
            parts["up"] = StackedExperts(ops.weight(fold_norm(up, ffn_norm)), e, f)
        return parts

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """Adapters may target the attention projections (the experts take none)."""
        return tuple(t for t in super().lora_targets(config) if t.projection in ("qkv", "o"))

    def feed_forward(self, weights: Any, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """The routed FFN, pre-normed and residual: updates and returns x (N, D)."""
        normed = ops.rms_normalize(x, weights.config.rms_eps)  # (N, D)
        x += self.routed(weights.config, weights.layers[layer], normed)  # (N, D)
        return x

    def routed(self, cfg: ModelConfig, w: RoutedFFN, normed: Array) -> Array:
        """The routed FFN's output (N, D) for normed inputs (N, D)."""
        logits = ops.linear(normed, w.router)  # (N, E)
        if w.router_bias is not None:
            logits += w.router_bias
        routing = route(logits, cfg.n_experts_used, gating=self.gating, normalize=self.normalize_weights,
                        scale=cfg.expert_weights_scale)
        gate_up = self.gate_up(w, normed, routing)  # (P, 2F)
        if w.gate_up_bias is not None:
            gate_up += w.gate_up_bias[routing.pair_expert]  # (P, 2F)
        hidden = self.expert_activation(gate_up)  # (P, F)
        down = ops.expert_linear(hidden, w.down, routing, per_pair=True)  # (P, D)
        if w.down_bias is not None:
            down += w.down_bias[routing.pair_expert]  # (P, D)
        return combine(down, routing)  # (N, D)

    def gate_up(self, w: RoutedFFN, normed: Array, routing: Any) -> Array:
        """Each pair's gate and up rows side by side: (P, 2F)."""
        if w.gate_up is not None:
            return ops.expert_linear(normed, w.gate_up, routing)  # (P, 2F)
        assert w.gate is not None and w.up is not None
        return np.concatenate([ops.expert_linear(normed, w.gate, routing),
                               ops.expert_linear(normed, w.up, routing)], axis=1)  # (P, 2F)

    def expert_activation(self, gate_up: Array) -> Array:
        """SiLU(gate) * up of each pair: (P, F)."""
        return ops.swiglu(gate_up)  # (P, F)


def expert_width(config: ModelConfig, path: str) -> int:
    """One expert's hidden width: expert_feed_forward_length, else (as llama.cpp) feed_forward_length / k."""
    if config.n_experts <= 0:
        raise ModelLoadError(path, f"{config.architecture} needs expert_count > 0")
    if config.d_ff_expert:
        return config.d_ff_expert
    return config.d_ff // max(1, config.n_experts_used)


def take_stacked(tensors: dict[str, Any], name: str, shape: tuple[int, int, int], path: str) -> Any:
    """A stacked-experts tensor (E, out, in) as one (E * out, in) matrix (quantized ones are kept so by the reader)."""
    e, out, cols = shape
    array = tensors.get(name)
    if array is not None and getattr(array, "ndim", 2) == 3:
        return np.ascontiguousarray(take(tensors, name, shape, path).reshape(e * out, cols))  # (E*out, in)
    return take(tensors, name, (e * out, cols), path)  # (E*out, in)
