"""The `llama` architecture (Llama, SmolLM, Mistral-style): RMSNorm, RoPE, GQA, SwiGLU, tied or separate output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import (
    Arrays,
    fold_norm,
    fuse_rows,
    scale_rows,
    take,
    unpermute_rope_rows,
)
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.file_fields import DECODER_KEYS
from worker.engine.forward_batch import ForwardBatch
from worker.engine.lora_targets import LoraPart, LoraTarget
from worker.engine.ops import Array, RotaryTable


@dataclass(frozen=True, kw_only=True)
class AttentionWeights(Arrays):
    """A block's attention; every matrix is (out, in), C-contiguous. Norm weights and 1/sqrt(Dh) are folded in at
    load."""

    wqkv: Array  # (H*Dh + 2*Hkv*Dh, D) fused query/key/value projection, attn_norm folded in
    bqkv: Array | None  # (H*Dh + 2*Hkv*Dh,) or None
    wo: Array  # (D, H*Dh)
    q_norm: Array | None = None  # (Dh,) QK-norm weight of queries, 1/sqrt(Dh) folded in (Qwen3), or None
    k_norm: Array | None = None  # (Dh,) QK-norm weight of keys, or None
    bo: Array | None = None  # (D,) the output projection's bias (gpt-oss), or None
    sinks: Array | None = None  # (H,) a logit per head in each softmax's denominator (gpt-oss), or None


@dataclass(frozen=True, kw_only=True)
class LlamaLayer(AttentionWeights):
    """One block: attention, then a dense SwiGLU FFN."""

    w_gate_up: Array  # (2F, D) fused gate/up projection, ffn_norm folded in
    w_down: Array  # (D, F)


@dataclass(frozen=True)
class LlamaWeights:
    """All weights of the model; `output` may be the same array as `token_embedding` (tied)."""

    config: ModelConfig
    token_embedding: Array  # (V, D)
    layers: tuple[Any, ...]  # LlamaLayer, or another AttentionWeights (a routed FFN's)
    output_norm: Array  # (D,)
    output: Array  # (V, D)
    rotary: RotaryTable
    rotary_local: RotaryTable | None = None  # the sliding-window layers' own table, where their base differs

    @property
    def nbytes(self) -> int:
        """Bytes of all distinct arrays."""
        total = self.token_embedding.nbytes + self.output_norm.nbytes + sum(layer.nbytes for layer in self.layers)
        return total if self.output is self.token_embedding else total + self.output.nbytes  # tied: one table


class Llama:
    """Pre-norm decoder block: x += Wo·attn(RoPE(Wqkv·norm(x))); x += Wdown·SwiGLU(Wgate_up·norm(x))."""

    name = "llama"
    rope_rows_permuted = True  # llama.cpp's converter permutes Q/K rows for adjacent-pair RoPE
    reads_rope_freqs = True  # Llama 3's per-dimension frequency factors (`rope_freqs.weight`), when the file has them
    qk_norm = False  # per-head RMS norm of queries and keys before RoPE (Qwen3), the query scale after it
    no_rope_every = 0  # > 0: every this-many-th layer ((layer + 1) % n == 0) attends without RoPE (SmolLM3's NoPE)
    metadata_keys = DECODER_KEYS
    layer_type: type = LlamaLayer  # a block's weights: attention's fields and load_feed_forward's

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> LlamaWeights:
        """Map GGUF tensor names to fused, matmul-ready weights (Q/K rows restored to half-rotation order)."""
        d, v = config.d_model, config.vocab_size
        layers = tuple(self.layer_type(**self.load_attention(tensors, config, i, path),
                                       **self.load_feed_forward(tensors, config, i, path))
                       for i in range(config.n_layers))
        embedding = ops.weight(take(tensors, "token_embd.weight", (v, d), path))  # (V, D) rows looked up
        output = (ops.weight(take(tensors, "output.weight", (v, d), path))
                  if "output.weight" in tensors else embedding)  # (V, D)
        return LlamaWeights(
            config=config,
            token_embedding=embedding,
            layers=layers,
            output_norm=ops.asarray(take(tensors, "output_norm.weight", (d,), path)),
            output=output,
            rotary=RotaryTable(config.rope_dim, config.rope_base, config.context_length, config.rope_scaling,
                               self.rope_freq_factors(tensors, config, path)),
        )

    def load_attention(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> dict[str, Any]:
        """Block i's attention fields (AttentionWeights)."""
        d, p = config.d_model, f"blk.{i}."
        query_scale = np.float32(1.0 / np.sqrt(config.head_dim))
        q_dim, kv_dim = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        wq = take(tensors, p + "attn_q.weight", (q_dim, d), path)  # (H*Dh, D)
        wk = take(tensors, p + "attn_k.weight", (kv_dim, d), path)  # (Hkv*Dh, D)
        wv = take(tensors, p + "attn_v.weight", (kv_dim, d), path)  # (Hkv*Dh, D)
        if self.rope_rows_permuted:
            wq = unpermute_rope_rows(wq, config.n_heads)  # (H*Dh, D)
            wk = unpermute_rope_rows(wk, config.n_kv_heads)  # (Hkv*Dh, D)
        row_scale = np.float32(1.0) if self.qk_norm else query_scale  # QK-norm: the scale goes after the norm
        if not self.qk_norm:
            wq = scale_rows(wq, query_scale)  # (H*Dh, D)
        bqkv = None
        if p + "attn_q.bias" in tensors:
            bqkv = np.concatenate([
                take(tensors, p + "attn_q.bias", (q_dim,), path) * row_scale,
                take(tensors, p + "attn_k.bias", (kv_dim,), path),
                take(tensors, p + "attn_v.bias", (kv_dim,), path),
            ]).astype(np.float32)  # (H*Dh + 2*Hkv*Dh,)
        attn_norm = take(tensors, p + "attn_norm.weight", (d,), path)  # (D,)
        return dict(
            wqkv=ops.weight(fold_norm(fuse_rows(wq, wk, wv), attn_norm)),  # (H*Dh + 2*Hkv*Dh, D)
            bqkv=None if bqkv is None else ops.asarray(bqkv),
            wo=ops.weight(take(tensors, p + "attn_output.weight", (d, q_dim), path)),  # (D, H*Dh)
            q_norm=ops.asarray(take(tensors, p + "attn_q_norm.weight", (config.head_dim,), path)
                               * query_scale) if self.qk_norm else None,  # (Dh,)
            k_norm=ops.asarray(take(tensors, p + "attn_k_norm.weight", (config.head_dim,), path))
            if self.qk_norm else None,  # (Dh,)
        )

    def load_feed_forward(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> dict[str, Any]:
        """Block i's dense SwiGLU fields (LlamaLayer's w_gate_up, w_down)."""
        d, f, p = config.d_model, config.d_ff, f"blk.{i}."
        ffn_norm = take(tensors, p + "ffn_norm.weight", (d,), path)  # (D,)
        return dict(
            w_gate_up=ops.weight(fold_norm(fuse_rows(
                take(tensors, p + "ffn_gate.weight", (f, d), path),
                take(tensors, p + "ffn_up.weight", (f, d), path),
            ), ffn_norm)),  # (2F, D)
            w_down=ops.weight(take(tensors, p + "ffn_down.weight", (d, f), path)),  # (D, F)
        )

    def rope_freq_factors(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> np.ndarray | None:
        """Llama 3's `rope_freqs.weight` (R/2,) dividing each pair's frequency, or None (absent, or not read here)."""
        if not self.reads_rope_freqs or "rope_freqs.weight" not in tensors:
            return None
        return np.asarray(take(tensors, "rope_freqs.weight", (config.rope_dim // 2,), path), np.float64)  # (R/2,)

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """The projections adapters may target, with the transforms `load` gives their base weights."""
        d, f = config.d_model, config.d_ff
        q_dim, kv_dim = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        permuted = self.rope_rows_permuted
        return (
            LoraTarget("qkv", (
                LoraPart("attn_q", q_dim, d, config.n_heads if permuted else 0,
                         1.0 if self.qk_norm else float(np.float32(1.0 / np.sqrt(config.head_dim)))),
                LoraPart("attn_k", kv_dim, d, config.n_kv_heads if permuted else 0),
                LoraPart("attn_v", kv_dim, d)), "attn_norm"),
            LoraTarget("o", (LoraPart("attn_output", d, q_dim),)),
            LoraTarget("gate_up", (LoraPart("ffn_gate", f, d), LoraPart("ffn_up", f, d)), "ffn_norm"),
            LoraTarget("down", (LoraPart("ffn_down", d, f),)),
        )

    def embed(self, weights: LlamaWeights, tokens: Array) -> Array:
        """Token ids (N,) to embeddings (N, D)."""
        return ops.embedding_rows(weights.token_embedding, tokens)  # (N, D)

    def block(self, weights: LlamaWeights, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """Attention then SwiGLU MLP, each pre-normed and residual; updates and returns x (N, D)."""
        cfg, w = weights.config, weights.layers[layer]
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        normed = ops.rms_normalize(x, cfg.rms_eps)  # (N, D)
        qkv = batch.adapt(layer, "qkv", normed,
                          ops.contiguous(ops.linear(normed, w.wqkv)))  # (N, H*Dh + 2*Hkv*Dh)
        if w.bqkv is not None:
            qkv += w.bqkv
        qk = qkv[:, : q_dim + kv_dim].reshape(-1, cfg.n_heads + cfg.n_kv_heads, cfg.head_dim)  # (N, H+Hkv, Dh)
        if w.q_norm is not None:
            qk = ops.rms_normalize_heads(qk, cfg.rms_eps)  # (N, H+Hkv, Dh)
            qk[:, : cfg.n_heads] *= w.q_norm  # (N, H, Dh)
            qk[:, cfg.n_heads :] *= w.k_norm  # (N, Hkv, Dh)
        window = self.window(cfg, layer)
        if not self.no_rope_every or (layer + 1) % self.no_rope_every:
            rotary = weights.rotary_local if window and weights.rotary_local is not None else weights.rotary
            cos, sin = batch.rope_angles(rotary)  # (N, 1, R/2) x2
            rotary.apply(qk, cos, sin)
        q = qk[:, : cfg.n_heads]  # (N, H, Dh)
        k = qk[:, cfg.n_heads :]  # (N, Hkv, Dh)
        v = qkv[:, q_dim + kv_dim :].reshape(-1, cfg.n_kv_heads, cfg.head_dim)  # (N, Hkv, Dh)
        attn = batch.attention(layer, q, k, v, window=window, sinks=w.sinks)  # (N, H*Dh)
        out = batch.adapt(layer, "o", attn, ops.linear(attn, w.wo))  # (N, D)
        if w.bo is not None:
            out += w.bo
        x += out  # (N, D)
        return self.feed_forward(weights, layer, x, batch)  # (N, D)

    def window(self, config: ModelConfig, layer: int) -> int:
        """Keys a layer's queries see (0: all; llama's layers attend over the whole sequence)."""
        return 0

    def feed_forward(self, weights: Any, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """The dense SwiGLU FFN, pre-normed and residual: updates and returns x (N, D)."""
        w = self.ffn_weights(weights, layer)
        normed = ops.rms_normalize(x, weights.config.rms_eps)  # (N, D)
        hidden = ops.swiglu(batch.adapt(layer, "gate_up", normed, ops.linear(normed, w.w_gate_up)))  # (N, F)
        x += batch.adapt(layer, "down", hidden, ops.linear(hidden, w.w_down))  # (N, D)
        return x

    def ffn_weights(self, weights: Any, layer: int) -> Any:
        """A block's FFN weights (w_gate_up, w_down): the block itself here."""
        return weights.layers[layer]

    def final_hidden(self, weights: LlamaWeights, x: Array) -> Array:
        """Final RMSNorm with its weight: (M, D)."""
        return ops.rms_norm(x, weights.output_norm, weights.config.rms_eps)  # (M, D)

    def logits(self, weights: LlamaWeights, hidden: Array) -> Array:
        """Tied or separate output projection: (M, V), rows contiguous."""
        return ops.linear_rows(hidden, weights.output)  # (M, V)
