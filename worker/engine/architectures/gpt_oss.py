"""The `gpt-oss` architecture (gpt-oss-20b, gpt-oss-120b; llama.cpp's openai-moe.cpp): biased query/key/value and
output projections, attention sinks (a learned per-head logit in each softmax's denominator), sliding-window
attention on every other layer (layer i when i % P < P - 1, P the file's sliding_window_pattern or 2), NEOX RoPE
with the file's YaRN scaling, and a routed FFN after a post-attention norm: biased router, the top k logits
softmaxed among themselves ("softmax weight" gating, no renormalising), biased experts (MXFP4 in the released
files) and the clamped SwiGLU gpt-oss uses (ggml's swiglu_oai: alpha 1.702, limit 7)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import take
from worker.engine.architectures.llama import LlamaWeights
from worker.engine.architectures.qwen3moe import EXPERT_KEYS, Qwen3MoE, expert_width
from worker.engine.experts import SOFTMAX_WEIGHT
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.file_fields import DECODER_KEYS
from worker.engine.ops import Array, RotaryTable

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # llama-graph.cpp's LLM_FFN_SWIGLU_OAI_MOE constants
SLIDING_WINDOW_PATTERN = 2  # load_swa_pattern(ml, 2): even layers slide, odd ones see everything


class GptOss(Qwen3MoE):
    """Llama-shaped attention with biases, sinks and alternating windows; a biased, softmax-weighted routed FFN."""

    name = "gpt-oss"
    rope_rows_permuted = False
    reads_rope_freqs = False
    qk_norm = False
    metadata_keys = DECODER_KEYS | EXPERT_KEYS | {"attention.sliding_window", "attention.sliding_window_pattern",
                                                  "rope.freq_base_swa"}
    gating = SOFTMAX_WEIGHT
    normalize_weights = False
    ffn_norm_name = "post_attention_norm"

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> LlamaWeights:
        """Qwen3-MoE's loading with gpt-oss's biases and sinks; a second rotary table where the file gives the
        sliding-window layers their own base."""
        weights = super().load(tensors, config, path)
        if config.rope_base_swa and config.rope_base_swa != config.rope_base:
            weights = replace(weights, rotary_local=RotaryTable(config.rope_dim, config.rope_base_swa,
                                                                config.context_length, config.rope_scaling))
        return weights

    def load_attention(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> dict[str, Any]:
        """Block i's attention fields with the output bias and the sinks."""
        parts = super().load_attention(tensors, config, i, path)
        p = f"blk.{i}."
        parts["bo"] = ops.asarray(np.asarray(take(tensors, p + "attn_output.bias", (config.d_model,), path),
                                             np.float32))  # (D,)
        parts["sinks"] = ops.asarray(np.asarray(take(tensors, p + "attn_sinks.weight", (config.n_heads,), path),
                                                np.float32))  # (H,)
        return parts

    def load_feed_forward(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> dict[str, Any]:
        """Block i's router and stacked experts with their biases."""
        parts = super().load_feed_forward(tensors, config, i, path)
        d, e, f, p = config.d_model, config.n_experts, expert_width(config, path), f"blk.{i}."
        bias = {name: np.asarray(take(tensors, f"{p}{name}.bias", shape, path), np.float32)
                for name, shape in (("ffn_gate_inp", (e,)), ("ffn_gate_exps", (e, f)), ("ffn_up_exps", (e, f)),
                                    ("ffn_down_exps", (e, d)))}
        parts["router_bias"] = ops.asarray(bias["ffn_gate_inp"])  # (E,)
        parts["gate_up_bias"] = ops.asarray(np.concatenate([bias["ffn_gate_exps"], bias["ffn_up_exps"]], axis=1))  # (E, 2F)
        parts["down_bias"] = ops.asarray(bias["ffn_down_exps"])  # (E, D)
        return parts

    def window(self, config: ModelConfig, layer: int) -> int:
        """The sliding window on layers i % P < P - 1, 0 (everything) on the others."""
        pattern = config.sliding_window_pattern or SLIDING_WINDOW_PATTERN
        return config.sliding_window if layer % pattern < pattern - 1 else 0

    def expert_activation(self, gate_up: Array) -> Array:
        """gpt-oss's clamped SwiGLU of each pair: (P, F)."""
        return ops.swiglu_clamped(gate_up, SWIGLU_ALPHA, SWIGLU_LIMIT)  # (P, F)
