"""worker.engine.kernels.mxfp4_matmul: the integer matmul over interleaved MXFP4 equals its numpy reference bit for bit at
every row count, on every instruction path this CPU has; a row's result does not depend on the rest of its step; the
exponent's edges and the largest values stay exact; the result stays close to dequantize(W) @ x."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numba import njit

from tests.support.kernel_paths import assert_every_path_gives, outputs_on_every_path
from tests.support.quant_data import random_mxfp4
from worker.engine.kernels import mxfp4_matmul
from worker.engine.kernels.simd_mxfp4 import wexp_half, wlookup16
from worker.engine.kernels.simd_wide import wfstore, wload_codes, wload_widened, wstore_codes
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4, interleave_mxfp4
from worker.engine.weights.mxfp4_blocks import KVALUES, MXFP4Blocks, decode_mxfp4, e8m0_half

ROW_COUNTS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 64, 70)


def matrix(rows: int, cols: int, seed: int, exponents: tuple[int, int] = (112, 132)) -> InterleavedMXFP4:
    """A random (rows, cols) MXFP4 matrix (exponents in [low, high): weights of a real model's size), interleaved."""
    rng = np.random.default_rng(seed)
    return interleave_mxfp4(decode_mxfp4(random_mxfp4(rows, cols, rng, exponents), (rows, cols)))


def activations(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random x (rows, cols) with an outlier, a zero block and a row of zeros."""
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)  # (rows, cols)
    x[0, 3] = 40.0
    x[-1, :32] = 0.0
    if rows > 2:
        x[1] = 0.0
    return x


def largest(sign: int) -> InterleavedMXFP4:
    """A (32, 128) matrix of every code at +12 (code 7) or -12 (code 15), exponents 1 (subnormal) to 199."""
    rows, cols = 32, 128
    code = 7 if sign > 0 else 15
    packed = np.full((rows, cols // 2), code | (code << 4), np.uint8)  # (32, 64)
    exponents = np.random.default_rng(8).integers(1, 200, (rows, cols // 32)).astype(np.uint8)  # (32, 4)
    return interleave_mxfp4(MXFP4Blocks(packed, exponents, np.ones(rows, np.float32)))


def test_every_row_count_equals_the_reference_bit_for_bit() -> None:
    blocks = matrix(37, 256, 2)  # an odd number of weight rows
    for n in ROW_COUNTS:
        x = activations(n, 256, n)
        np.testing.assert_array_equal(mxfp4_matmul.mxfp4_matmul(x, blocks), mxfp4_matmul.reference_matmul(x, blocks),
                                      err_msg=f"{n} rows")


def test_a_rows_result_is_the_same_alone_and_among_others() -> None:
    blocks = matrix(48, 192, 3)
    x = activations(100, 192, 4)  # more than three tiles of X_ROWS
    together = mxfp4_matmul.mxfp4_matmul(x, blocks)  # (100, 48)
    for k in (0, 1, 31, 32, 99):
        np.testing.assert_array_equal(mxfp4_matmul.mxfp4_matmul(x[k : k + 1], blocks)[0], together[k])


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("x_sign", [1.0, -1.0])
def test_the_largest_values_and_activations_stay_exact(sign: int, x_sign: float) -> None:
    """Every value at +-12 against activations all +-1 (high bytes +-127): the int32 sums (16 * 24 * 256 * 127
    before the zero point comes off) are exact, and every exponent gives its power of two."""
    blocks = largest(sign)
    x = np.full((20, 128), x_sign, np.float32)  # (20, 128)
    got = mxfp4_matmul.mxfp4_matmul(x, blocks)  # (20, 32)
    np.testing.assert_array_equal(got, mxfp4_matmul.reference_matmul(x, blocks))
    exact = x.astype(np.float64) @ blocks.dequantize().T.astype(np.float64)  # (20, 32)
    np.testing.assert_allclose(got, exact, rtol=1e-6)


def test_subnormal_and_edge_exponents_match_the_reference() -> None:
    """Exponents 0 and 1 (subnormal scales) and 250..255 (scales up to 2**127) through the kernel: the reference's
    bits, infinities included."""
    rows, cols = 16, 64
    exponents = np.array([[0, 1], [254, 255], [250, 251], [0, 255]] * 4, np.uint8)  # (16, 2)
    packed = np.random.default_rng(9).integers(0, 256, (rows, cols // 2)).astype(np.uint8)  # (16, 32)
    blocks = interleave_mxfp4(MXFP4Blocks(packed, exponents, np.ones(rows, np.float32)))
    x = np.random.default_rng(10).standard_normal((3, cols)).astype(np.float32) * np.float32(1e-3)  # (3, 64)
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(mxfp4_matmul.mxfp4_matmul(x, blocks), mxfp4_matmul.reference_matmul(x, blocks))


def test_close_to_float_arithmetic() -> None:
    """Against dequantize(W) @ x in float64: within the two-byte activations' error."""
    blocks = matrix(64, 2880, 5)
    x = np.random.default_rng(6).standard_normal((3, 2880)).astype(np.float32)  # (3, 2880)
    exact = x.astype(np.float64) @ blocks.dequantize().T.astype(np.float64)  # (3, 64)
    error = np.abs(mxfp4_matmul.mxfp4_matmul(x, blocks) - exact).max() / np.abs(exact).max()
    assert error < 0.001


def test_row_scales_scale_the_rows() -> None:
    plain = decode_mxfp4(random_mxfp4(20, 96, np.random.default_rng(11), (120, 130)), (20, 96))
    x = activations(4, 96, 12)
    scaled = interleave_mxfp4(plain.scaled(np.float32(0.125)))  # a power of two: the same bits, scaled
    np.testing.assert_array_equal(mxfp4_matmul.mxfp4_matmul(x, scaled),
                                  mxfp4_matmul.mxfp4_matmul(x, interleave_mxfp4(plain)) * np.float32(0.125))
    odd = interleave_mxfp4(plain.scaled(np.float32(0.3)))
    np.testing.assert_array_equal(mxfp4_matmul.mxfp4_matmul(x, odd), mxfp4_matmul.reference_matmul(x, odd))


def test_a_matrix_that_does_not_fit_x_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        mxfp4_matmul.mxfp4_matmul(np.ones((2, 64), np.float32), matrix(16, 128, 1))


@njit
def _vector_ops(table, codes, exponents, looked, scales):  # pragma: no cover (compiled)
    """wlookup16 over 64 codes and wexp_half over every group of 16 exponent bytes."""
    wstore_codes(looked, 0, wlookup16(wload_codes(table, 0), wload_codes(codes, 0)))
    for at in range(0, exponents.shape[0], 16):
        wfstore(scales, at, wexp_half(wload_widened(exponents, at)))


def vector_ops() -> list[np.ndarray]:
    """The table looked up by every code, and every exponent byte decoded, by the kernel's vector operations."""
    codes = np.arange(64, dtype=np.uint8) % 16  # (64,) each code in each 128-bit lane
    codes[16:32] = codes[16:32][::-1]
    looked, scales = np.empty(64, np.uint8), np.empty(256, np.float32)
    _vector_ops(mxfp4_matmul.LOOKUP, codes, np.arange(256, dtype=np.uint8), looked, scales)
    return [looked, scales]


def test_the_vector_operations_are_the_tables() -> None:
    looked, scales = vector_ops()
    codes = np.arange(64) % 16
    codes[16:32] = codes[16:32][::-1]
    np.testing.assert_array_equal(looked.astype(np.int16) - mxfp4_matmul.ZERO, KVALUES[codes])
    np.testing.assert_array_equal(scales, e8m0_half(np.arange(256, dtype=np.uint8)))


def test_every_path_gives_the_same_bits(tmp_path: Path) -> None:
    """LLMFLEET_INT_KERNELS forces each path (vpshufb and vpdpbusd on avx512vnni, vpshufb and vpmaddubsw on avx2,
    portable vector code on generic); every path this CPU has gives the reference's bits."""
    body = (
        "from tests.worker.engine.kernels.test_mxfp4_matmul import matrix, activations, largest, vector_ops\n"
        "from worker.engine.kernels import mxfp4_matmul\n"
        "outputs = [mxfp4_matmul.mxfp4_matmul(activations(n, 128, n), matrix(25, 128, 7)) for n in (1, 5, 33)]\n"
        "outputs += [mxfp4_matmul.mxfp4_matmul(np.full((3, 128), 1.0, np.float32), largest(s)) for s in (1, -1)]\n"
        "outputs += vector_ops()\n"
    )
    expected = [mxfp4_matmul.reference_matmul(activations(n, 128, n), matrix(25, 128, 7)) for n in (1, 5, 33)]
    expected += [mxfp4_matmul.reference_matmul(np.full((3, 128), 1.0, np.float32), largest(s)) for s in (1, -1)]
    expected += vector_ops()
    assert_every_path_gives(outputs_on_every_path(tmp_path, body), expected)
