"""The `gemma3` architecture: QK-norm, norms before and after attention and MLP, GeGLU, √D-scaled embeddings,
sliding-window attention (window from metadata) on five of every six layers, a separate RoPE base for those.

As llama.cpp's gemma3 loader and graph: layer i is global when i % P == P - 1 (P the file's
attention.sliding_window_pattern, 6 when it names none), local layers use rope.freq_base_swa (10000 when absent) and
no context scaling, global ones the file's freq_base and scaling; the query scale is 1/sqrt(head_dim) applied after
QK-norm, and the converter already added Gemma's +1 to every norm weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import fold_norm, fuse_rows, take
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.file_fields import DECODER_KEYS
from worker.engine.forward_batch import ForwardBatch
from worker.engine.lora_targets import LoraPart, LoraTarget
from worker.engine.ops import Array, RotaryTable

SLIDING_WINDOW_PATTERN = 6  # every 6th layer (i % 6 == 5) attends globally, unless the file names another pattern
LOCAL_ROPE_BASE = 10000.0  # the sliding-window layers' RoPE base when the file names none (llama.cpp's default)


def is_global_layer(layer: int, pattern: int = SLIDING_WINDOW_PATTERN) -> bool:
    """Whether a layer attends over the whole sequence (the others use the sliding window)."""
    return layer % pattern == pattern - 1


@dataclass(frozen=True)
class Gemma3Layer:
    """One block; matrices are (out, in), C-contiguous; pre-norm weights folded into the following matmuls."""

    wqkv: Array  # (H*Dh + 2*Hkv*Dh, D) fused query/key/value projection, attn_norm folded in
    q_norm: Array  # (Dh,) QK-norm weight of queries, 1/sqrt(Dh) folded in
    k_norm: Array  # (Dh,) QK-norm weight of keys
    wo: Array  # (D, H*Dh)
    post_attention_norm: Array  # (D,)
    w_gate_up: Array  # (2F, D) fused gate/up projection, ffn_norm folded in
    w_down: Array  # (D, F)
    post_ffw_norm: Array  # (D,)
    window: int  # 0 for a global layer
    rotary: RotaryTable  # the local or the global table

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays in the block (the shared rotary tables excluded)."""
        arrays = (self.wqkv, self.q_norm, self.k_norm, self.wo, self.post_attention_norm, self.w_gate_up,
                  self.w_down, self.post_ffw_norm)
        return sum(a.nbytes for a in arrays)


@dataclass(frozen=True)
class Gemma3Weights:
    """All weights; `output` is usually the embedding itself (tied)."""

    config: ModelConfig
    token_embedding: Array  # (V, D)
    embedding_scale: float  # sqrt(D)
    layers: tuple[Gemma3Layer, ...]
    output_norm: Array  # (D,)
    output: Array  # (V, D)

    @property
    def nbytes(self) -> int:
        """Bytes of all distinct arrays."""
        total = self.token_embedding.nbytes + self.output_norm.nbytes + sum(layer.nbytes for layer in self.layers)
        return total if self.output is self.token_embedding else total + self.output.nbytes  # tied: one table


class Gemma3:
    """x += post_norm(Wo·attn(RoPE(QKnorm(Wqkv·norm(x))))); x += post_norm(Wdown·GeGLU(Wgate_up·norm(x)))."""

    name = "gemma3"
    metadata_keys = DECODER_KEYS | {"attention.sliding_window", "attention.sliding_window_pattern",
                                    "rope.freq_base_swa", "final_logit_softcapping"}

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> Gemma3Weights:
        """Map GGUF tensors to fused, matmul-ready weights (Q/K rows are already in half-rotation order)."""
        d, v = config.d_model, config.vocab_size
        global_rotary = RotaryTable(config.rope_dim, config.rope_base, config.context_length, config.rope_scaling)
        local_rotary = (RotaryTable(config.rope_dim, config.rope_base_swa or LOCAL_ROPE_BASE, config.context_length)
                        if config.sliding_window > 0 else global_rotary)
        pattern = config.sliding_window_pattern or SLIDING_WINDOW_PATTERN
        layers = []
        for i in range(config.n_layers):
            local = config.sliding_window > 0 and not is_global_layer(i, pattern)
            layers.append(self._layer(tensors, config, path, i, local_rotary if local else global_rotary,
                                      window=config.sliding_window if local else 0))
        embedding = ops.weight(take(tensors, "token_embd.weight", (v, d), path))  # (V, D) rows looked up
        output = (ops.weight(take(tensors, "output.weight", (v, d), path))
                  if "output.weight" in tensors else embedding)  # (V, D)
        return Gemma3Weights(
            config=config,
            token_embedding=embedding,
            embedding_scale=float(np.sqrt(np.float32(d))),
            layers=tuple(layers),
            output_norm=ops.asarray(take(tensors, "output_norm.weight", (d,), path)),
            output=output,
        )

    @staticmethod
    def _layer(tensors: dict[str, np.ndarray], config: ModelConfig, path: str, i: int, rotary: RotaryTable, *,
               window: int) -> Gemma3Layer:
        """Block i: Q/K/V fused with the attention norm folded in, the query scale in the q-norm, gate and up fused."""
        d, f, dh = config.d_model, config.d_ff, config.head_dim
        q_dim, kv_dim = config.n_heads * dh, config.n_kv_heads * dh
        p = f"blk.{i}."
        attn_norm = take(tensors, p + "attn_norm.weight", (d,), path)  # (D,)
        ffn_norm = take(tensors, p + "ffn_norm.weight", (d,), path)  # (D,)
        return Gemma3Layer(
            wqkv=ops.weight(fold_norm(fuse_rows(
                take(tensors, p + "attn_q.weight", (q_dim, d), path),
                take(tensors, p + "attn_k.weight", (kv_dim, d), path),
                take(tensors, p + "attn_v.weight", (kv_dim, d), path),
            ), attn_norm)),  # (H*Dh + 2*Hkv*Dh, D)
            q_norm=ops.asarray(take(tensors, p + "attn_q_norm.weight", (dh,), path)
                               * np.float32(1.0 / np.sqrt(dh))),  # (Dh,) the query scale folded in
            k_norm=ops.asarray(take(tensors, p + "attn_k_norm.weight", (dh,), path)),  # (Dh,)
            wo=ops.weight(take(tensors, p + "attn_output.weight", (d, q_dim), path)),  # (D, H*Dh)
            post_attention_norm=ops.asarray(take(tensors, p + "post_attention_norm.weight", (d,), path)),  # (D,)
            w_gate_up=ops.weight(fold_norm(fuse_rows(
                take(tensors, p + "ffn_gate.weight", (f, d), path),
                take(tensors, p + "ffn_up.weight", (f, d), path),
            ), ffn_norm)),  # (2F, D)
            w_down=ops.weight(take(tensors, p + "ffn_down.weight", (d, f), path)),  # (D, F)
            post_ffw_norm=ops.asarray(take(tensors, p + "post_ffw_norm.weight", (d,), path)),  # (D,)
            window=window,
            rotary=rotary,
        )

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """The projections adapters may target (Q/K rows unpermuted in the file; the query scale follows QK-norm)."""
        d, f = config.d_model, config.d_ff
        q_dim, kv_dim = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        return (
            LoraTarget("qkv", (LoraPart("attn_q", q_dim, d), LoraPart("attn_k", kv_dim, d),
                               LoraPart("attn_v", kv_dim, d)), "attn_norm"),
            LoraTarget("o", (LoraPart("attn_output", d, q_dim),)),
            LoraTarget("gate_up", (LoraPart("ffn_gate", f, d), LoraPart("ffn_up", f, d)), "ffn_norm"),
            LoraTarget("down", (LoraPart("ffn_down", d, f),)),
        )

    def embed(self, weights: Gemma3Weights, tokens: Array) -> Array:
        """Token ids (N,) to embeddings scaled by sqrt(D): (N, D)."""
        x = ops.embedding_rows(weights.token_embedding, tokens)  # (N, D) a new array: scaling in place is safe
        x *= np.float32(weights.embedding_scale)
        return x

    def block(self, weights: Gemma3Weights, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """Attention then GeGLU MLP, each pre- and post-normed, residual; updates and returns x (N, D)."""
        cfg, w = weights.config, weights.layers[layer]
        n_heads, n_kv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_dim, kv_dim = n_heads * dh, n_kv * dh
        normed = ops.rms_normalize(x, cfg.rms_eps)  # (N, D)
        qkv = batch.adapt(layer, "qkv", normed, ops.linear(normed, w.wqkv))  # (N, H*Dh + 2*Hkv*Dh)
        qk = ops.rms_normalize_heads(qkv[:, : q_dim + kv_dim].reshape(-1, n_heads + n_kv, dh),
                                     cfg.rms_eps)  # (N, H+Hkv, Dh)
        qk[:, :n_heads] *= w.q_norm  # (N, H, Dh)
        qk[:, n_heads:] *= w.k_norm  # (N, Hkv, Dh)
        cos, sin = batch.rope_angles(w.rotary)  # (N, 1, R/2) x2
        w.rotary.apply(qk, cos, sin)
        v = qkv[:, q_dim + kv_dim :].reshape(-1, n_kv, dh)  # (N, Hkv, Dh)
        attn = batch.attention(layer, qk[:, :n_heads], qk[:, n_heads:], v, window=w.window)  # (N, H*Dh)
        x += ops.rms_norm(batch.adapt(layer, "o", attn, ops.linear(attn, w.wo)), w.post_attention_norm,
                          cfg.rms_eps)  # (N, D)
        normed = ops.rms_normalize(x, cfg.rms_eps)  # (N, D)
        hidden = ops.geglu(batch.adapt(layer, "gate_up", normed, ops.linear(normed, w.w_gate_up)))  # (N, F)
        mlp = batch.adapt(layer, "down", hidden, ops.linear(hidden, w.w_down))  # (N, D)
        x += ops.rms_norm(mlp, w.post_ffw_norm, cfg.rms_eps)  # (N, D)
        return x

    def final_hidden(self, weights: Gemma3Weights, x: Array) -> Array:
        """Final RMSNorm with its weight: (M, D)."""
        return ops.rms_norm(x, weights.output_norm, weights.config.rms_eps)  # (M, D)

    def logits(self, weights: Gemma3Weights, hidden: Array) -> Array:
        """Tied output projection, soft-capped when the file asks for it: (M, V), rows contiguous."""
        logits = ops.linear_rows(hidden, weights.output)  # (M, V)
        if weights.config.final_logit_softcap > 0:
            ops.soft_cap(logits, weights.config.final_logit_softcap)  # (M, V)
        return logits
