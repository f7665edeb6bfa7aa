"""worker.engine.weights.interleaved_mxfp4: MXFP4 interleaved sixteen rows at a time keeps the file's bytes (half a byte a
weight, a byte per 32), the row scales and the float32 weights exactly, and an embedding lookup reads its rows."""

from __future__ import annotations

import numpy as np

from tests.support.quant_data import random_mxfp4
from worker.engine.weights.interleaved_mxfp4 import interleave_mxfp4
from worker.engine.weights.mxfp4_blocks import decode_mxfp4


def test_interleaving_keeps_bytes_scales_and_weights() -> None:
    """37 rows (a padded last group), a row scaled: the bytes and float32 weights come back exactly."""
    rows, cols = 37, 128
    plain = decode_mxfp4(random_mxfp4(rows, cols, np.random.default_rng(1)), (rows, cols))
    plain = plain.take_rows(np.arange(rows)[::-1]).scaled(np.float32(0.5))
    blocks = interleave_mxfp4(plain)
    assert blocks.shape == (rows, cols) and blocks.codes.shape == (3, 4, 4, 64) and blocks.exponents.shape == (3, 4, 16)
    assert blocks.nbytes == 3 * 16 * (cols // 2 + cols // 32 + 4)  # the padded rows' bytes too
    np.testing.assert_array_equal(blocks.file_bytes(), plain.codes)
    np.testing.assert_array_equal(blocks.code_rows(), plain.code_rows())
    np.testing.assert_array_equal(blocks.block_scale(), plain.block_scale())
    np.testing.assert_array_equal(blocks.dequantize(), plain.dequantize())
    index = np.array([36, 0, 17, 17])
    np.testing.assert_array_equal(blocks.rows(index), plain.rows(index))


def test_a_vector_holds_four_code_bytes_of_sixteen_rows() -> None:
    """codes[g, b, v, 4r + i] is byte 4v + i of row 16g + r's block b (the file's order)."""
    rows, cols = 20, 64
    plain = decode_mxfp4(random_mxfp4(rows, cols, np.random.default_rng(2)), (rows, cols))
    blocks = interleave_mxfp4(plain)
    file_blocks = plain.codes.reshape(rows, cols // 32, 16)  # (rows, B, 16)
    assert blocks.codes[1, 1, 2, 4 * 3 + 1] == file_blocks[16 + 3, 1, 4 * 2 + 1]
    assert blocks.exponents[1, 0, 2] == plain.exponents[18, 0]
    assert not blocks.codes[1, :, :, 16:].any() and not blocks.row_scale[1, 4:].any()  # padding rows
