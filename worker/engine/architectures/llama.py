"""The `llama` architecture (Llama, SmolLM, Mistral-style): RMSNorm, RoPE, GQA, SwiGLU, tied or separate output."""

from __future__ import annotations

import numpy as np

from worker.engine.architectures.common import fold_norm, fuse_rows, take, unpermute_rope_rows
from worker.engine.config import ModelConfig
from worker.engine.weights import LayerWeights, TransformerWeights


def build_weights(
    tensors: dict[str, np.ndarray], config: ModelConfig, path: str, *, rope_rows_permuted: bool = True
) -> TransformerWeights:
    """Map GGUF tensor names to fused, matmul-ready weights (Q/K rows restored to half-rotation order)."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    query_scale = np.float32(1.0 / np.sqrt(config.head_dim))
    q_dim, kv_dim = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    layers = []
    for i in range(config.n_layers):
        p = f"blk.{i}."
        wq = take(tensors, p + "attn_q.weight", (q_dim, d), path)  # (H*Dh, D)
        wk = take(tensors, p + "attn_k.weight", (kv_dim, d), path)  # (Hkv*Dh, D)
        wv = take(tensors, p + "attn_v.weight", (kv_dim, d), path)  # (Hkv*Dh, D)
        if rope_rows_permuted:
            wq = unpermute_rope_rows(wq, config.n_heads)  # (H*Dh, D)
            wk = unpermute_rope_rows(wk, config.n_kv_heads)  # (Hkv*Dh, D)
        wq = wq * query_scale  # (H*Dh, D)
        bqkv = None
        if p + "attn_q.bias" in tensors:
            bqkv = np.concatenate([
                take(tensors, p + "attn_q.bias", (q_dim,), path) * query_scale,
                take(tensors, p + "attn_k.bias", (kv_dim,), path),
                take(tensors, p + "attn_v.bias", (kv_dim,), path),
            ]).astype(np.float32)  # (H*Dh + 2*Hkv*Dh,)
        attn_norm = take(tensors, p + "attn_norm.weight", (d,), path)  # (D,)
        ffn_norm = take(tensors, p + "ffn_norm.weight", (d,), path)  # (D,)
        layers.append(LayerWeights(
            wqkv=fold_norm(fuse_rows(wq, wk, wv), attn_norm),  # (H*Dh + 2*Hkv*Dh, D)
            bqkv=bqkv,
            wo=np.ascontiguousarray(take(tensors, p + "attn_output.weight", (d, q_dim), path)),  # (D, H*Dh)
            w_gate_up=fold_norm(fuse_rows(
                take(tensors, p + "ffn_gate.weight", (f, d), path),
                take(tensors, p + "ffn_up.weight", (f, d), path),
            ), ffn_norm),  # (2F, D)
            w_down=np.ascontiguousarray(take(tensors, p + "ffn_down.weight", (d, f), path)),  # (D, F)
        ))
    embedding = take(tensors, "token_embd.weight", (v, d), path)  # (V, D)
    output = take(tensors, "output.weight", (v, d), path) if "output.weight" in tensors else embedding  # (V, D)
    return TransformerWeights(
        token_embedding=embedding,
        layers=tuple(layers),
        output_norm=take(tensors, "output_norm.weight", (d,), path),
        output=output,
    )
