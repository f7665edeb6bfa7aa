"""The `bert` architecture (BERT, MiniLM, sentence-transformers encoders): an embedding-only encoder.

Learned absolute positions and token types (always type 0, as llama.cpp), LayerNorm after each residual add,
bidirectional attention within each text, GELU (tanh form, as ggml), biases everywhere, no final norm and no
output projection. It has no KV cache: a text is encoded whole in one forward, many texts side by side. The
matmuls are ops.encoder_linear's (BLAS); attention, the residual adds with their LayerNorms and bias + GELU are the
compiled kernels of encoder_layers.py, which read the matmuls' outputs in the order BLAS leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import fuse_rows, scale_rows, take
from worker.engine.formats.config import ModelConfig
from worker.engine.kernels import encoder_layers
from worker.engine.kernels.encoder_layers import add_layer_norm, attend_texts, bias_gelu
from worker.engine.lora_targets import LoraTarget
from worker.engine.ops import Array


@dataclass(frozen=True)
class BertLayer:
    """One encoder block; matrices are (out, in), the query rows and bias pre-scaled by 1/sqrt(Dh)."""

    wqkv: Array  # (3*H*Dh, D) fused query/key/value projection
    bqkv: Array  # (3*H*Dh,)
    wo: Array  # (D, H*Dh)
    bo: Array  # (D,)
    attn_norm_weight: Array  # (D,)
    attn_norm_bias: Array  # (D,)
    w_up: Array  # (F, D)
    b_up: Array  # (F,)
    w_down: Array  # (D, F)
    b_down: Array  # (D,)
    out_norm_weight: Array  # (D,)
    out_norm_bias: Array  # (D,)

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays in the block."""
        return sum(getattr(self, name).nbytes for name in self.__dataclass_fields__)


@dataclass(frozen=True)
class BertWeights:
    """All weights of an encoder."""

    config: ModelConfig
    token_embedding: Array  # (V, D)
    position_embedding: Array  # (P, D)
    type_zero: Array  # (D,) token type 0's row
    embed_norm_weight: Array  # (D,)
    embed_norm_bias: Array  # (D,)
    layers: tuple[BertLayer, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays."""
        arrays = (self.token_embedding, self.position_embedding, self.type_zero, self.embed_norm_weight,
                  self.embed_norm_bias)
        return sum(a.nbytes for a in arrays) + sum(layer.nbytes for layer in self.layers)


class Bert:
    """x = LN(tok + pos + type0); per layer x = LN(x + Wo·attn(Wqkv·x)); x = LN(x + Wdown·GELU(Wup·x))."""

    name = "bert"
    metadata_keys = frozenset({"block_count", "context_length", "embedding_length", "feed_forward_length",
                               "attention.head_count", "attention.head_count_kv", "attention.key_length",
                               "attention.value_length", "attention.layer_norm_epsilon", "attention.causal",
                               "pooling_type", "vocab_size"})  # an encoder: bidirectional attention by nature
    encoder = True  # embedding-only: Model.encode, never Model.forward or a KV pool

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> BertWeights:
        """Map GGUF tensors (llama.cpp's bert names) to fused, matmul-ready weights."""
        d, v = config.d_model, config.vocab_size
        layers = [self._layer(tensors, config, path, i) for i in range(config.n_layers)]
        positions = ops.dense(take(tensors, "position_embd.weight", (config.context_length, d), path))  # (P, D)
        encoder_layers.warm()  # compiled (or read from numba's cache) at load, not on the first request
        types = tensors.get("token_types.weight")
        type_zero = (ops.dense(types)[0] if types is not None else np.zeros(d, np.float32))  # (D,)
        return BertWeights(
            config=config,
            token_embedding=ops.weight(take(tensors, "token_embd.weight", (v, d), path)),  # (V, D) rows looked up
            position_embedding=ops.asarray(positions),
            type_zero=ops.asarray(np.ascontiguousarray(type_zero, np.float32)),
            embed_norm_weight=ops.asarray(take(tensors, "token_embd_norm.weight", (d,), path)),  # (D,)
            embed_norm_bias=ops.asarray(take(tensors, "token_embd_norm.bias", (d,), path)),  # (D,)
            layers=tuple(layers),
        )

    @staticmethod
    def _layer(tensors: dict[str, np.ndarray], config: ModelConfig, path: str, i: int) -> BertLayer:
        """Block i: Q/K/V and their biases fused, the query scale folded into Q's rows and bias."""
        d, f, dh = config.d_model, config.d_ff, config.head_dim
        inner = config.n_heads * dh
        scale = np.float32(1.0 / np.sqrt(dh))
        p = f"blk.{i}."
        wq = scale_rows(take(tensors, p + "attn_q.weight", (inner, d), path), scale)  # (H*Dh, D)
        bqkv = np.concatenate([take(tensors, p + "attn_q.bias", (inner,), path) * scale,
                               take(tensors, p + "attn_k.bias", (inner,), path),
                               take(tensors, p + "attn_v.bias", (inner,), path)])  # (3*H*Dh,)
        return BertLayer(
            wqkv=ops.weight(fuse_rows(wq, take(tensors, p + "attn_k.weight", (inner, d), path),
                                      take(tensors, p + "attn_v.weight", (inner, d), path))),  # (3*H*Dh, D)
            bqkv=ops.asarray(bqkv, np.float32),
            wo=ops.weight(take(tensors, p + "attn_output.weight", (d, inner), path)),  # (D, H*Dh)
            bo=ops.asarray(take(tensors, p + "attn_output.bias", (d,), path)),  # (D,)
            attn_norm_weight=ops.asarray(take(tensors, p + "attn_output_norm.weight", (d,), path)),  # (D,)
            attn_norm_bias=ops.asarray(take(tensors, p + "attn_output_norm.bias", (d,), path)),  # (D,)
            w_up=ops.weight(take(tensors, p + "ffn_up.weight", (f, d), path)),  # (F, D)
            b_up=ops.asarray(take(tensors, p + "ffn_up.bias", (f,), path)),  # (F,)
            w_down=ops.weight(take(tensors, p + "ffn_down.weight", (d, f), path)),  # (D, F)
            b_down=ops.asarray(take(tensors, p + "ffn_down.bias", (d,), path)),  # (D,)
            out_norm_weight=ops.asarray(take(tensors, p + "layer_output_norm.weight", (d,), path)),  # (D,)
            out_norm_bias=ops.asarray(take(tensors, p + "layer_output_norm.bias", (d,), path)),  # (D,)
        )

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """Encoders take no LoRA adapters here."""
        return ()

    def encode(self, weights: BertWeights, tokens: Array, positions: Array, starts: Array) -> Array:
        """Final hidden states (N, D) of many texts at once: tokens/positions (N,), text i in rows
        starts[i]..starts[i+1]-1, each attending over its own rows only."""
        cfg = weights.config
        eps, n_heads, dh = cfg.layer_norm_eps, cfg.n_heads, cfg.head_dim
        x = ops.embedding_rows(weights.token_embedding, tokens)  # (N, D)
        x += weights.position_embedding[positions]  # (N, D)
        x += weights.type_zero
        x = np.ascontiguousarray(ops.layer_norm(x, weights.embed_norm_weight, weights.embed_norm_bias, eps),
                                 np.float32)  # (N, D) row-major: the kernels update it in place
        for w in weights.layers:
            qkv_t = ops.encoder_linear(x, w.wqkv).T  # (3*H*Dh, N) as BLAS leaves it; the bias is added in the kernel
            attn = attend_texts(qkv_t, w.bqkv, starts, n_heads, dh)  # (N, H*Dh)
            x = add_layer_norm(x, ops.encoder_linear(attn, w.wo), w.bo, w.attn_norm_weight, w.attn_norm_bias,
                               eps)  # (N, D)
            hidden_t = np.ascontiguousarray(ops.encoder_linear(x, w.w_up).T)  # (F, N), no copy when BLAS made it so
            bias_gelu(hidden_t, w.b_up)  # (F, N)
            x = add_layer_norm(x, ops.encoder_linear(hidden_t.T, w.w_down), w.b_down, w.out_norm_weight, w.out_norm_bias,
                               eps)  # (N, D)
        return x  # (N, D)
