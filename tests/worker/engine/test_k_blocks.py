"""worker.engine.k_blocks: Q4_K, Q5_K and Q6_K kept in the file's super-block form dequantize exactly as gguf does, and
their row transforms, stacking and 8-bit conversion keep the same weights."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tests.support.quant_data import random_blocks
from worker.engine.k_blocks import (
    K_KINDS,
    decode_k_blocks,
    pack_fifth_bits,
    pack_high_bits,
    unpack_fifth_bits,
    unpack_high_bits,
)
from worker.engine.quant_blocks import decode_block_codes, held_bytes, pack_nibbles


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
    codes = blocks.code_rows()  # (rows, cols): the arrays are these codes packed as the module says
    np.testing.assert_array_equal(blocks.codes, pack_nibbles(codes & 0x0F))
    if kind != "Q4_K":
        pack = pack_fifth_bits if kind == "Q5_K" else pack_high_bits
        np.testing.assert_array_equal(blocks.high, pack(codes))


def test_high_bits_are_four_a_byte_in_block_order() -> None:
    """Byte j of a block's eight holds columns j, j+8, j+16, j+24 in bit pairs 0-1, 2-3, 4-5, 6-7."""
    codes = np.random.default_rng(4).integers(0, 64, (3, 64), dtype=np.uint8)  # (3, 64)
    high = pack_high_bits(codes)  # (3, 16)
    assert high.shape == (3, 16)
    for block in range(2):
        for j in range(8):
            byte = int(high[1, 8 * block + j])
            for i in range(4):
                assert (byte >> (2 * i)) & 3 == codes[1, 32 * block + j + 8 * i] >> 4
    np.testing.assert_array_equal(unpack_high_bits(high), codes >> 4)


def test_fifth_bits_are_eight_a_byte_in_block_order() -> None:
    """Byte j of a block's four holds columns j, j+4, .., j+28 in bits 0..7."""
    codes = np.random.default_rng(6).integers(0, 32, (3, 64), dtype=np.uint8)  # (3, 64)
    high = pack_fifth_bits(codes)  # (3, 8)
    assert high.shape == (3, 8)
    for block in range(2):
        for j in range(4):
            byte = int(high[2, 4 * block + j])
            for i in range(8):
                assert (byte >> i) & 1 == codes[2, 32 * block + j + 4 * i] >> 4
    np.testing.assert_array_equal(unpack_fifth_bits(high), codes >> 4)


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
    np.testing.assert_array_equal(a.as_block_codes().dequantize(), dense)
