"""worker.engine.nibble_kernels: packed 4-bit matmuls equal their numpy reference bit for bit, and a row's result
does not depend on how many rows share its step."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine import nibble_kernels
from worker.engine.quant_blocks import BlockCodes, pack_nibbles, unpack_nibbles


def _matrix(rng: np.random.Generator, out_dim: int, in_dim: int) -> tuple[np.ndarray, ...]:
    """Random 4-bit codes (out, in), their packed form (out, in/2) and tables (out, in/32)."""
    codes = rng.integers(0, 16, (out_dim, in_dim), dtype=np.uint8)  # (out, in)
    scale = rng.uniform(-0.1, 0.1, (out_dim, in_dim // 32)).astype(np.float32)  # (out, in/32)
    offset = rng.uniform(-1, 1, (out_dim, in_dim // 32)).astype(np.float32)  # (out, in/32)
    return codes, pack_nibbles(codes), scale, offset


def test_packing_is_ggml_q4_0_order_and_round_trips() -> None:
    """Byte j of a 32-column block holds column j in its low nibble and column j + 16 in its high one."""
    codes = np.arange(64, dtype=np.uint8).reshape(1, 64) % 16  # (1, 64)
    codes[0, 40] = 9
    packed = pack_nibbles(codes)  # (1, 32)
    assert packed.shape == (1, 32) and packed.dtype == np.uint8
    for block in range(2):
        for j in range(16):
            byte = packed[0, 16 * block + j]
            assert byte & 15 == codes[0, 32 * block + j] and byte >> 4 == codes[0, 32 * block + 16 + j]
    assert np.array_equal(unpack_nibbles(packed), codes)


def test_block_codes_of_packed_form_dequantize_as_the_unpacked() -> None:
    """A BlockCodes holding packed codes has the unpacked shape, rows and float32 matrix."""
    codes, packed, scale, offset = _matrix(np.random.default_rng(1), 5, 64)
    plain = BlockCodes(codes, scale, offset, 32)
    assert plain.packable()
    held = BlockCodes(packed, scale, offset, 32, packed=True)
    assert held.shape == (5, 64) and held.nbytes == packed.nbytes + scale.nbytes + offset.nbytes
    assert np.array_equal(held.dequantize(), plain.dequantize())
    assert np.array_equal(held.code_rows(np.array([3, 1])), codes[[3, 1]])
    assert not BlockCodes(codes | 16, scale, offset, 32).packable()  # a code over 15
    assert not BlockCodes(codes[:, :48], scale[:, :1], offset[:, :1], 48).packable()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 15, 16, 17, 22, 23, 40])
@pytest.mark.parametrize("out_dim", [40, 37])
def test_kernels_equal_the_numpy_reference_bit_for_bit(rows: int, out_dim: int) -> None:
    """Narrow (pairs, an odd last row, a partial weight tile of 37) and wide (sixes, fours, singles, an odd
    last weight row) kernels compute exactly the reference's arithmetic, which is near the float64 matmul."""
    rng = np.random.default_rng(rows + out_dim)
    codes, packed, scale, offset = _matrix(rng, out_dim, 256)
    x = rng.standard_normal((rows, 256)).astype(np.float32)  # (K, C)
    got = nibble_kernels.packed_matmul(x, packed, scale, offset)  # (K, R)
    assert got.shape == (rows, out_dim) and got.flags.c_contiguous
    expected = nibble_kernels.reference_matmul(x, packed, scale, offset)  # (K, R)
    assert np.array_equal(got, expected)
    weight = BlockCodes(codes, scale, offset, 32).dequantize().astype(np.float64)  # (R, C)
    np.testing.assert_allclose(got, x.astype(np.float64) @ weight.T, rtol=1e-4, atol=1e-4)


def test_each_row_of_a_product_equals_the_row_computed_alone() -> None:
    """Batch invariance: for K = 1..80 and 200 rows of x, row k of the K-row product is bit for bit the product
    of row k alone (narrow and wide kernels, every tile shape)."""
    rng = np.random.default_rng(7)
    _, packed, scale, offset = _matrix(rng, 37, 192)
    x = rng.standard_normal((200, 192)).astype(np.float32)  # (200, C)
    alone = np.concatenate([nibble_kernels.packed_matmul(x[k : k + 1], packed, scale, offset)
                            for k in range(200)])  # (200, R)
    for count in [*range(1, 81), 200]:
        together = nibble_kernels.packed_matmul(x[:count], packed, scale, offset)  # (K, R)
        assert np.array_equal(together, alone[:count]), count


def test_read_only_mapped_arrays_and_bad_shapes() -> None:
    """Read-only codes and tables (as mapped from the repack cache) work; a mismatched x is refused."""
    _, packed, scale, offset = _matrix(np.random.default_rng(3), 8, 64)
    for array in (packed, scale, offset):
        array.flags.writeable = False
    x = np.ones((2, 64), np.float32)  # (K, C)
    assert np.array_equal(nibble_kernels.packed_matmul(x, packed, scale, offset),
                          nibble_kernels.reference_matmul(x, packed, scale, offset))
    with pytest.raises(ValueError, match="do not fit"):
        nibble_kernels.packed_matmul(np.ones((2, 32), np.float32), packed, scale, offset)
