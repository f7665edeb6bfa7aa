"""The `qwen3` architecture (dense): llama's block with per-head RMS norm of queries and keys before RoPE (QK-norm),
NEOX RoPE (rows not permuted by the converter), no biases, head_dim from attention.key_length (llama.cpp's qwen3.cpp).
"""

from __future__ import annotations

from worker.engine.architectures.llama import Llama


class Qwen3(Llama):
    """Qwen3 tensors are llama's plus attn_q_norm / attn_k_norm per layer; the query scale follows the QK-norm."""

    name = "qwen3"
    rope_rows_permuted = False
    reads_rope_freqs = False  # llama.cpp's qwen3 graph passes no frequency factors
    qk_norm = True
