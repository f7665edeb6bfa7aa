"""worker.engine.weights.k_blocks: Q4_K, Q5_K and Q6_K kept in the file's super-block form dequantize exactly as gguf does, and
their row transforms, stacking and 8-bit conversion keep the same weights."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tests.support.quant_data import random_blocks
from worker.engine.weights.k_blocks import K_KINDS, code_bytes, decode_k_blocks
from worker.engine.weights.quant_blocks import decode_block_codes, held_bytes


@pytest.mark.parametrize("kind", K_KINDS)
def test_decoded_form_dequantizes_exactly_as_gguf(kind: str) -> None:
    rows, cols = 6, 512
    raw = random_blocks(kind, rows, cols, np.random.default_rng(3))
    blocks = decode_k_blocks(raw, kind, (rows, cols))
    expected = dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, cols)  # (rows, cols)
    np.testing.assert_array_equal(blocks.dequantize(), expected)
    np.testing.assert_array_equal(blocks.dequantize(), decode_block_codes(raw, kind, (rows, cols)).dequantize())
    assert blocks.shape == (rows, cols) and blocks.nbytes == held_bytes(kind, rows * cols)
    np.testing.assert_array_equal(blocks.rows(np.array([4, 1])), expected[[4, 1]])
    codes = blocks.code_rows()  # (rows, cols): the arrays are these codes laid out as the module says
    packed, high = code_bytes(codes, kind)
    np.testing.assert_array_equal(blocks.codes, packed)
    assert (high is None) == (kind == "Q4_K") and (high is None or np.array_equal(blocks.high, high))


@pytest.mark.parametrize("kind", K_KINDS)
def test_the_code_bytes_are_the_files(kind: str) -> None:
    """The codes are copied from the file's super-blocks, not re-packed (a 32-byte load gives a block's codes)."""
    raw = random_blocks(kind, 2, 512, np.random.default_rng(7))  # (2, bytes per row)
    blocks = decode_k_blocks(raw, kind, (2, 512))
    supers = raw.reshape(4, -1)  # (row * super-block, bytes)
    if kind == "Q6_K":
        np.testing.assert_array_equal(blocks.codes.reshape(4, 128), supers[:, :128])
        np.testing.assert_array_equal(blocks.high.reshape(4, 64), supers[:, 128:192])
    else:
        fifth = 32 if kind == "Q5_K" else 0
        np.testing.assert_array_equal(blocks.codes.reshape(4, 128), supers[:, 16 + fifth :])
        if fifth:
            np.testing.assert_array_equal(blocks.high.reshape(4, 32), supers[:, 16:48])
    codes = blocks.code_rows()  # (2, 512)
    assert codes.max() < {"Q4_K": 16, "Q5_K": 32, "Q6_K": 64}[kind]
    high_nibbles = slice(64, 96) if kind == "Q6_K" else slice(32, 64)  # the columns of bytes 0..31's high nibbles
    np.testing.assert_array_equal(codes[:, high_nibbles] & 0x0F, blocks.codes[:, 0:32] >> 4)


@pytest.mark.parametrize("kind", K_KINDS)
def test_transforms_keep_the_weights(kind: str) -> None:
    rng = np.random.default_rng(5)
    a = decode_k_blocks(random_blocks(kind, 4, 256, rng), kind, (4, 256))
    b = decode_k_blocks(random_blocks(kind, 3, 256, rng), kind, (3, 256))
    dense = a.dequantize()  # (4, 256)
    order = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(a.take_rows(order).dequantize(), dense[order])
    np.testing.assert_allclose(a.scaled(np.float32(0.5)).dequantize(), dense * 0.5, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(a.stacked([b]).dequantize(), np.concatenate([dense, b.dequantize()]))
