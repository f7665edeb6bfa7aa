"""The `llama` architecture (Llama, SmolLM, Mistral-style): RMSNorm, RoPE, GQA, SwiGLU, tied or separate output."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import take
from worker.engine.config import ModelConfig
from worker.engine.forward_batch import ForwardBatch
from worker.engine.lora_targets import LoraPart, LoraTarget
from worker.engine.ops import Array, RotaryTable


@dataclass(frozen=True)
class LlamaLayer:
    """One block; every matrix is (out, in) as the file stores it (quantized ones stay in their blocks)."""

    attn_norm: Array  # (D,) applied to x before the q/k/v projections
    wq: Array  # (H*Dh, D) rows in the file's order (adjacent RoPE pairs for llama)
    wk: Array  # (Hkv*Dh, D)
    wv: Array  # (Hkv*Dh, D)
    bqkv: Array | None  # (H*Dh + 2*Hkv*Dh,) or None
    wo: Array  # (D, H*Dh)
    ffn_norm: Array  # (D,)
    w_gate: Array  # (F, D)
    w_up: Array  # (F, D)
    w_down: Array  # (D, F)

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays in the block (quantized ones: their mapped bytes)."""
        arrays = [self.attn_norm, self.wq, self.wk, self.wv, self.wo, self.ffn_norm, self.w_gate, self.w_up,
                  self.w_down]
        return sum(a.nbytes for a in arrays) + (0 if self.bqkv is None else self.bqkv.nbytes)


@dataclass(frozen=True)
class LlamaWeights:
    """All weights of the model; `output` may be the same matrix as `token_embedding` (tied)."""

    config: ModelConfig
    token_embedding: Array  # (V, D)
    layers: tuple[LlamaLayer, ...]
    output_norm: Array  # (D,)
    output: Array  # (V, D)
    rotary: RotaryTable
    query_scale: np.float32  # 1/sqrt(Dh), applied to q after its projection

    @property
    def nbytes(self) -> int:
        """Bytes of all distinct arrays."""
        total = self.token_embedding.nbytes + self.output_norm.nbytes + sum(layer.nbytes for layer in self.layers)
        return total + (0 if self.output is self.token_embedding else self.output.nbytes)


class Llama:
    """Pre-norm decoder block: x += Wo·attn(RoPE(Wq,k,v·norm(x))); x += Wdown·SwiGLU(Wgate,up·norm(x))."""

    name = "llama"
    rope_rows_permuted = True  # llama.cpp's converter permutes Q/K rows for adjacent-pair RoPE

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> LlamaWeights:
        """Map GGUF tensor names to weights, each kept as the file stores it (no load-time rewrite)."""
        d, f, v = config.d_model, config.d_ff, config.vocab_size
        q_dim, kv_dim = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        layers = []
        for i in range(config.n_layers):
            p = f"blk.{i}."
            bqkv = None
            if p + "attn_q.bias" in tensors:
                bqkv = np.concatenate([
                    take(tensors, p + "attn_q.bias", (q_dim,), path),
                    take(tensors, p + "attn_k.bias", (kv_dim,), path),
                    take(tensors, p + "attn_v.bias", (kv_dim,), path),
                ]).astype(np.float32)  # (H*Dh + 2*Hkv*Dh,)
            layers.append(LlamaLayer(
                attn_norm=ops.asarray(take(tensors, p + "attn_norm.weight", (d,), path)),  # (D,)
                wq=ops.weight(take(tensors, p + "attn_q.weight", (q_dim, d), path)),  # (H*Dh, D)
                wk=ops.weight(take(tensors, p + "attn_k.weight", (kv_dim, d), path)),  # (Hkv*Dh, D)
                wv=ops.weight(take(tensors, p + "attn_v.weight", (kv_dim, d), path)),  # (Hkv*Dh, D)
                bqkv=None if bqkv is None else ops.asarray(bqkv),
                wo=ops.weight(take(tensors, p + "attn_output.weight", (d, q_dim), path)),  # (D, H*Dh)
                ffn_norm=ops.asarray(take(tensors, p + "ffn_norm.weight", (d,), path)),  # (D,)
                w_gate=ops.weight(take(tensors, p + "ffn_gate.weight", (f, d), path)),  # (F, D)
                w_up=ops.weight(take(tensors, p + "ffn_up.weight", (f, d), path)),  # (F, D)
                w_down=ops.weight(take(tensors, p + "ffn_down.weight", (d, f), path)),  # (D, F)
            ))
        embedding = ops.weight(take(tensors, "token_embd.weight", (v, d), path))  # (V, D)
        output = (ops.weight(take(tensors, "output.weight", (v, d), path))
                  if "output.weight" in tensors else embedding)  # (V, D)
        return LlamaWeights(
            config=config,
            token_embedding=embedding,
            layers=tuple(layers),
            output_norm=ops.asarray(take(tensors, "output_norm.weight", (d,), path)),
            output=output,
            rotary=RotaryTable(config.rope_dim, config.rope_base, config.context_length,
                               interleaved=self.rope_rows_permuted),
            query_scale=np.float32(1.0 / np.sqrt(config.head_dim)),
        )

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """The projections adapters may target (their base weights are used as the file stores them)."""
        d, f = config.d_model, config.d_ff
        q_dim, kv_dim = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        return (
            LoraTarget("qkv", (LoraPart("attn_q", q_dim, d), LoraPart("attn_k", kv_dim, d),
                               LoraPart("attn_v", kv_dim, d))),
            LoraTarget("o", (LoraPart("attn_output", d, q_dim),)),
            LoraTarget("gate_up", (LoraPart("ffn_gate", f, d), LoraPart("ffn_up", f, d))),
            LoraTarget("down", (LoraPart("ffn_down", d, f),)),
        )

    def embed(self, weights: LlamaWeights, tokens: Array) -> Array:
        """Token ids (N,) to embeddings (N, D)."""
        return ops.embedding_rows(weights.token_embedding, tokens)  # (N, D)

    def block(self, weights: LlamaWeights, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """Attention then SwiGLU MLP, each pre-normed and residual; updates and returns x (N, D)."""
        cfg, w = weights.config, weights.layers[layer]
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        normed = ops.rms_norm(x, w.attn_norm, cfg.rms_eps)  # (N, D)
        qkv = batch.adapt(layer, "qkv", normed, ops.linear_parts(normed, (w.wq, w.wk, w.wv)))  # (N, H*Dh + 2*Hkv*Dh)
        if w.bqkv is not None:
            qkv += w.bqkv
        qk = qkv[:, : q_dim + kv_dim].reshape(-1, cfg.n_heads + cfg.n_kv_heads, cfg.head_dim)  # (N, H+Hkv, Dh)
        cos, sin = batch.rope_angles(weights.rotary)  # (N, 1, R/2) x2
        weights.rotary.apply(qk, cos, sin)
        q = qk[:, : cfg.n_heads]  # (N, H, Dh)
        q *= weights.query_scale
        k = qk[:, cfg.n_heads :]  # (N, Hkv, Dh)
        v = qkv[:, q_dim + kv_dim :].reshape(-1, cfg.n_kv_heads, cfg.head_dim)  # (N, Hkv, Dh)
        attn = batch.attention(layer, q, k, v)  # (N, H*Dh)
        x += batch.adapt(layer, "o", attn, ops.linear(attn, w.wo))  # (N, D)
        normed = ops.rms_norm(x, w.ffn_norm, cfg.rms_eps)  # (N, D)
        gate_up = ops.linear_parts(normed, (w.w_gate, w.w_up))  # (N, 2F)
        hidden = ops.swiglu(batch.adapt(layer, "gate_up", normed, gate_up))  # (N, F)
        x += batch.adapt(layer, "down", hidden, ops.linear(hidden, w.w_down))  # (N, D)
        return x

    def final_hidden(self, weights: LlamaWeights, x: Array) -> Array:
        """Final RMSNorm with its weight: (M, D)."""
        return ops.rms_norm(x, weights.output_norm, weights.config.rms_eps)  # (M, D)

    def logits(self, weights: LlamaWeights, hidden: Array) -> Array:
        """Tied or separate output projection: (M, V), rows contiguous."""
        return ops.linear_rows(hidden, weights.output)  # (M, V)
