"""Block codes decoded from every supported GGUF format equal gguf's own dequantization, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from worker.engine.quant_blocks import SUPPORTED, decode_block_codes

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


@pytest.mark.parametrize("kind", SUPPORTED)
def test_codes_times_scale_plus_offset_is_ggufs_dequantization(kind: str) -> None:
    rng = np.random.default_rng(7)
    rows, cols = 6, 512
    raw = random_blocks(kind, rows, cols, rng)
    expected = dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, cols)  # (rows, cols)
    blocks = decode_block_codes(raw, kind, (rows, cols))
    assert blocks is not None
    assert blocks.codes.dtype == np.uint8 and blocks.codes.shape == (rows, cols)
    assert blocks.scale.shape == (rows, cols // blocks.group) == blocks.offset.shape
    np.testing.assert_allclose(blocks.dequantize(), expected, rtol=1e-6, atol=1e-7)


def test_unsupported_formats_and_shapes_are_left_to_float32() -> None:
    rng = np.random.default_rng(1)
    assert decode_block_codes(random_blocks("Q8_0", 2, 64, rng), "Q3_K", (2, 64)) is None
    assert decode_block_codes(random_blocks("Q8_0", 2, 64, rng), "Q4_K", (2, 64)) is None  # 64 < one super-block
