"""worker.engine.kernels.interleaved_matmul and interleaved_blocks: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 interleaved sixteen rows
at a time hold the file's codes and tables exactly, and their integer matmuls equal the numpy reference bit for bit
at every row count, on every instruction path this CPU has; a row's result does not depend on the rest of its step;
the activations are two int8 bytes per 16 columns and the result stays close to float arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.kernel_paths import assert_every_path_gives, outputs_on_every_path
from tests.support.quant_data import random_blocks
from worker.engine.kernels import interleaved_matmul
from worker.engine.kernels.int8_spans import reference_spans_fine
from worker.engine.weights.interleaved_blocks import InterleavedBlocks, interleave
from worker.engine.weights.quant_blocks import BlockCodes, decode_block_codes

KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
ZERO = {"Q4_0": 8, "Q4_1": 0, "Q5_0": 16, "Q5_1": 0, "Q8_0": 128}
ROW_COUNTS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 64, 70)


def decoded(kind: str, rows: int, cols: int, seed: int) -> BlockCodes:
    """A random (rows, cols) matrix of the kind, decoded from raw GGUF bytes."""
    codes = decode_block_codes(random_blocks(kind, rows, cols, np.random.default_rng(seed)), kind, (rows, cols))
    assert codes is not None
    return codes


def matrix(kind: str, rows: int, cols: int, seed: int) -> InterleavedBlocks:
    """The same matrix interleaved."""
    return interleave(decoded(kind, rows, cols, seed))


def activations(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random x (rows, cols) with an outlier, a zero block and a row of zeros."""
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)  # (rows, cols)
    x[0, 3] = 40.0
    x[-1, :32] = 0.0
    if rows > 2:
        x[1] = 0.0
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_interleaving_keeps_codes_tables_and_weights(kind: str) -> None:
    """37 rows (a padded last group): the codes and float32 weights come back exactly, the zero point is the
    format's (Q4_1 and Q5_1 keep their offsets instead), four-bit codes take half a byte."""
    plain = decoded(kind, 37, 128, 1)
    blocks = interleave(plain)
    assert blocks.shape == (37, 128) and blocks.zero == ZERO[kind] and (blocks.offset is None) == (ZERO[kind] > 0)
    assert blocks.nibbles == kind.startswith("Q4") and blocks.codes.shape == (3, 4, 4 if blocks.nibbles else 8, 64)
    np.testing.assert_array_equal(blocks.code_rows(), plain.codes)
    np.testing.assert_array_equal(blocks.dequantize(), plain.dequantize())
    index = np.array([36, 0, 17, 17])
    np.testing.assert_array_equal(blocks.rows(index), plain.rows(index))


def test_activations_are_two_bytes_per_16_columns() -> None:
    """A high byte as int8_spans' one-byte rule, and the remainder in 256ths: sixteen bits, within dx / 512."""
    x = activations(5, 256, 1)
    q, low, dx, sums = interleaved_matmul.quantize_halves(x)
    assert q.dtype == low.dtype == np.int8 and dx.shape == sums.shape == (5, 16) and sums.dtype == np.int32
    assert np.abs(q).max() == 127 and not dx[-1, :2].any() and not q[-1, :32].any() and not low[-1, :32].any()
    value = 256 * q.astype(np.int64) + low  # (5, 256)
    np.testing.assert_array_equal(sums, value.reshape(5, 16, 16).sum(axis=2))
    span = dx[2][:, None].astype(np.float64)  # (16, 1) dx / 256
    np.testing.assert_allclose(value[2].reshape(16, 16) * span, x[2].reshape(16, 16), atol=float(span.max()))
    for got, expected in zip((q, low, dx), reference_spans_fine(x, 16)):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kind", KINDS)
def test_every_row_count_equals_the_reference_bit_for_bit(kind: str) -> None:
    blocks = matrix(kind, 37, 256, 2)  # an odd number of weight rows
    for n in ROW_COUNTS:
        x = activations(n, 256, n)
        np.testing.assert_array_equal(interleaved_matmul.interleaved_matmul(x, blocks),
                                      interleaved_matmul.reference_matmul(x, blocks), err_msg=f"{kind} {n} rows")


@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_result_is_the_same_alone_and_among_others(kind: str) -> None:
    blocks = matrix(kind, 48, 192, 3)
    x = activations(100, 192, 4)  # more than three tiles of X_ROWS
    together = interleaved_matmul.interleaved_matmul(x, blocks)  # (100, 48)
    for k in (0, 1, 31, 32, 99):
        np.testing.assert_array_equal(interleaved_matmul.interleaved_matmul(x[k : k + 1], blocks)[0], together[k])


def largest(kind: str) -> InterleavedBlocks:
    """A (32, 128) matrix of the kind with every code at its largest (Q8_0: +127, and -128 in odd rows)."""
    plain = decoded(kind, 32, 128, 5)
    top = 15 if kind.startswith("Q4") else 31 if kind.startswith("Q5") else 255
    codes = np.full(plain.codes.shape, top, np.uint8)
    if kind == "Q8_0":
        codes[1::2] = 0
    return interleave(BlockCodes(codes, plain.scale, plain.offset, plain.group))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_codes_and_activations_stay_exact(kind: str, sign: float) -> None:
    """Every code at its largest against activations all +-1 (high bytes +-127): the int32 sums (16 * 255 * 256 *
    127 before Q8_0's zero point comes off) are exact."""
    blocks = largest(kind)
    x = np.full((20, 128), sign, np.float32)  # (20, 128)
    np.testing.assert_array_equal(interleaved_matmul.interleaved_matmul(x, blocks),
                                  interleaved_matmul.reference_matmul(x, blocks))


@pytest.mark.parametrize("kind", KINDS)
def test_close_to_float_arithmetic(kind: str) -> None:
    blocks = matrix(kind, 64, 1024, 5)
    x = np.random.default_rng(6).standard_normal((3, 1024)).astype(np.float32)  # (3, 1024)
    exact = x.astype(np.float64) @ blocks.dequantize().T.astype(np.float64)  # (3, 64)
    error = np.abs(interleaved_matmul.interleaved_matmul(x, blocks) - exact).max() / np.abs(exact).max()
    assert error < 0.002  # sixteen bits of activation: int8 alone gave about 0.01


def test_a_matrix_that_does_not_fit_x_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        interleaved_matmul.interleaved_matmul(np.ones((2, 64), np.float32), matrix("Q4_0", 16, 128, 1))


def test_every_path_gives_the_same_bits(tmp_path: Path) -> None:
    """LLMFLEET_INT_KERNELS forces each path (vpdpbusd on avx512vnni, vpmaddubsw on avx2, portable vector code on
    generic); every path this CPU has gives the reference's bits, the largest codes and activations included (on
    avx2 a pair of products near 32767 would saturate)."""
    body = (
        "from tests.worker.engine.kernels.test_interleaved_matmul import KINDS, matrix, activations, largest\n"
        "from worker.engine.kernels import interleaved_matmul\n"
        "outputs = [interleaved_matmul.interleaved_matmul(activations(n, 128, n), matrix(kind, 25, 128, 7))\n"
        "           for kind in KINDS for n in (1, 5, 33)]\n"
        "outputs += [interleaved_matmul.interleaved_matmul(np.full((3, 128), sign, np.float32), largest(kind))\n"
        "            for kind in KINDS for sign in (1.0, -1.0)]\n"
    )
    expected = [interleaved_matmul.reference_matmul(activations(n, 128, n), matrix(kind, 25, 128, 7))
                for kind in KINDS for n in (1, 5, 33)]
    expected += [interleaved_matmul.reference_matmul(np.full((3, 128), sign, np.float32), largest(kind))
                 for kind in KINDS for sign in (1.0, -1.0)]
    assert_every_path_gives(outputs_on_every_path(tmp_path, body), expected)
