"""Random raw GGUF tensor data of the quantized types, for kernel and decoding tests."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

F16_FIELDS = {  # byte offsets of float16 scales inside one block (random bytes there could be inf/NaN)
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (-2,),
}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random raw data of a (rows, cols) tensor of the given type, with finite float16 scales."""
    qtype = GGMLQuantizationType[kind]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * cols // block_size, type_size), dtype=np.uint8)  # (blocks, bytes)
    for at in F16_FIELDS[kind]:
        scales = rng.uniform(-0.05, 0.05, raw.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)  # (blocks, 2)
        raw[:, at : at + 2 if at != -2 else None] = scales
    return raw.reshape(rows, cols // block_size * type_size)  # (rows, bytes per row)


def random_mxfp4(rows: int, cols: int, rng: np.random.Generator, exponents: tuple[int, int] = (0, 256)) -> np.ndarray:
    """Random raw MXFP4 data of a (rows, cols) tensor, its E8M0 exponents drawn from [low, high) (the default, every
    byte, reaches scales whose larger values overflow float32): (rows, bytes per row)."""
    raw = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)  # (rows, blocks, exponent + 16 code bytes)
    raw[:, :, 0] = rng.integers(*exponents, (rows, cols // 32))
    return raw.reshape(rows, -1)
