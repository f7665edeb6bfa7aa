"""The `smollm3` architecture: llama's block (Q/K rows permuted by the converter), with every fourth layer
attending without RoPE (NoPE: llama.cpp's smollm3.cpp, n_no_rope_layer_step 4) and no frequency factors."""

from __future__ import annotations

from worker.engine.architectures.llama import Llama


class SmolLM3(Llama):
    """SmolLM3 tensors are llama's; layers 3, 7, 11, ... skip the rotary embedding."""

    name = "smollm3"
    reads_rope_freqs = False  # llama.cpp's smollm3 graph passes no frequency factors
    no_rope_every = 4
