"""The `qwen2` architecture: llama's block with Q/K/V biases and NEOX RoPE (rows not permuted by the converter)."""

from __future__ import annotations

from worker.engine.architectures.llama import Llama


class Qwen2(Llama):
    """Qwen2 tensors are llama's plus biases, with Q/K already in half-rotation order."""

    name = "qwen2"
    rope_rows_permuted = False
    reads_rope_freqs = False  # llama.cpp's qwen2 graph has no frequency factors
