"""Block codes decoded from every supported GGUF format equal gguf's own dequantization, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tests.support.quant_data import random_blocks
from worker.engine.weights.quant_blocks import BLOCK_CODED, decode_block_codes


@pytest.mark.parametrize("kind", BLOCK_CODED)
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
