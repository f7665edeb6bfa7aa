"""worker.engine.int_kernels: the integer matmuls over Q4_K, Q5_K and Q6_K equal their numpy reference bit for bit
at every row count (the row-major loops, int_tiles.py's interleaved tiles and wide_tiles.py's 512-bit ones alike), on
every instruction path this CPU has; a row's result does not depend on the rest of its step; the activations are
int8 per 64 columns and the result stays close to float arithmetic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.kernel_paths import assert_every_path_gives, outputs_on_every_path
from tests.support.quant_data import random_blocks
from worker.engine import int_kernels, simd_int
from worker.engine.k_blocks import K_KINDS, KBlocks, decode_k_blocks
from worker.engine.simd_int import PAIRED_GROUPS, int_path, supported_paths

ROW_COUNTS = (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 64, 65, 70)


def matrix(kind: str, rows: int, cols: int, seed: int) -> KBlocks:
    """A random (rows, cols) matrix of the kind, decoded from raw GGUF bytes."""
    return decode_k_blocks(random_blocks(kind, rows, cols, np.random.default_rng(seed)), kind, (rows, cols))


def activations(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random x (rows, cols) with an outlier, a zero super-block and a row of zeros."""
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)  # (rows, cols)
    x[0, 3] = 40.0
    x[-1, :256] = 0.0
    if rows > 2:
        x[1] = 0.0
    return x


def test_quantization_is_int8_per_64_columns_and_equals_its_reference() -> None:
    x = activations(5, 512, 1)
    rows = int_kernels.quantize_rows(x)
    for got, expected in zip(rows, int_kernels.reference_quantize(x)):
        np.testing.assert_array_equal(got, expected)
    q, dx, dx8, sums16, sums32 = rows
    assert dx.shape == (5, 8) and dx8.shape == (5, 2, 8) and sums16.shape == (5, 32) and sums32.shape == (5, 16)
    assert sums16.dtype == sums32.dtype == np.int16
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and not dx[-1, :4].any() and not q[-1, :256].any()
    np.testing.assert_allclose(q[2].reshape(8, 64) * dx[2][:, None], x[2].reshape(8, 64), atol=float(dx[2].max()))
    np.testing.assert_array_equal(dx8[2, 1], np.tile(dx[2, 4:], 2))
    groups = q[3].reshape(32, 16).sum(axis=1)  # (32,) in column order
    np.testing.assert_array_equal(sums16[3], groups.reshape(2, 16)[:, list(PAIRED_GROUPS)].reshape(32))
    np.testing.assert_array_equal(sums32[3], q[3].reshape(16, 32).sum(axis=1))


@pytest.mark.parametrize("kind", K_KINDS)
def test_every_row_count_equals_the_reference_bit_for_bit(kind: str) -> None:
    blocks = matrix(kind, 37, 512, 2)  # an odd number of weight rows
    for n in ROW_COUNTS:
        x = activations(n, 512, n)
        np.testing.assert_array_equal(int_kernels.k_matmul(x, blocks), int_kernels.reference_matmul(x, blocks),
                                      err_msg=f"{kind} {n} rows")


@pytest.mark.parametrize("kind", K_KINDS)
def test_a_rows_result_is_the_same_alone_and_among_others(kind: str) -> None:
    blocks = matrix(kind, 24, 768, 3)
    x = activations(130, 768, 4)  # more than two passes of ROW_CHUNK
    together = int_kernels.k_matmul(x, blocks)  # (130, 24)
    for k in (0, 1, 63, 64, 129):
        np.testing.assert_array_equal(int_kernels.k_matmul(x[k : k + 1], blocks)[0], together[k])


@pytest.mark.parametrize("kind", K_KINDS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_codes_and_activations_stay_exact(kind: str, sign: float) -> None:
    """Every code and sub-scale at its largest (Q6_K's int8 sub-scales at -128) and every activation at +-127: the
    interleaved tiles' int16 sums of products (four pairs for Q4_K/Q5_K: 4 * 2 * 31 * 127; two for Q6_K: 2 * 2 * 63
    * 127) stay below 32768, so wide steps equal the reference too."""
    rows, cols = 32, 512
    supers = cols // 256
    codes, d = np.full((rows, cols // 2), 0xFF, np.uint8), np.full((rows, supers), 0.01, np.float32)
    if kind == "Q6_K":
        blocks = KBlocks(kind, codes, np.full((rows, cols // 16), -128, np.int8), d,
                         high=np.full((rows, cols // 4), 0xFF, np.uint8))
    else:
        fifth = np.full((rows, cols // 8), 0xFF, np.uint8) if kind == "Q5_K" else None
        blocks = KBlocks(kind, codes, np.full((rows, cols // 32), 63, np.uint8), d, high=fifth,
                         mins=np.full((rows, cols // 32), 63, np.uint8), dmin=np.full((rows, supers), 0.02, np.float32))
    x = np.full((20, cols), sign, np.float32)  # (20, cols): every activation quantizes to +-127
    np.testing.assert_array_equal(int_kernels.k_matmul(x, blocks), int_kernels.reference_matmul(x, blocks))


@pytest.mark.parametrize("kind", K_KINDS)
def test_close_to_float_arithmetic(kind: str) -> None:
    blocks = matrix(kind, 64, 1024, 5)
    x = np.random.default_rng(6).standard_normal((3, 1024)).astype(np.float32)  # (3, 1024)
    exact = x.astype(np.float64) @ blocks.dequantize().T.astype(np.float64)  # (3, 64)
    error = np.abs(int_kernels.k_matmul(x, blocks) - exact).max() / np.abs(exact).max()
    assert error < 0.02


def test_generic_path_gives_the_same_bits_as_this_cpus(tmp_path: Path) -> None:
    """LLMFLEET_INT_KERNELS forces each path; every path this CPU has gives the reference's bits (25 weight rows: a
    full task of sixteen takes the tiles, eight-row or wide, at 17 x rows)."""
    body = (
        "from tests.worker.engine.test_int_kernels import matrix, activations\n"
        "from worker.engine import int_kernels\n"
        "outputs = [int_kernels.k_matmul(activations(n, 512, n), matrix(kind, 25, 512, 7))\n"
        "           for kind in ('Q4_K', 'Q5_K', 'Q6_K') for n in (1, 5, 17)]\n"
    )
    expected = [int_kernels.reference_matmul(activations(n, 512, n), matrix(kind, 25, 512, 7))
                for kind in K_KINDS for n in (1, 5, 17)]
    assert_every_path_gives(outputs_on_every_path(tmp_path, body), expected)


@pytest.fixture
def fresh_path_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A monkeypatch under which int_path() chooses afresh (its cached choice is dropped before and after)."""
    int_path.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    int_path.cache_clear()


def test_a_path_this_cpu_lacks_is_refused(fresh_path_choice: pytest.MonkeyPatch) -> None:
    """Forcing AVX2 or AVX-512 VNNI on a CPU without them is refused at start, never an illegal instruction."""
    fresh_path_choice.setattr(simd_int.llvm_binding, "get_host_cpu_features", lambda: {"avx2": True})
    assert supported_paths() == ("avx2", "generic")
    fresh_path_choice.setenv("LLMFLEET_INT_KERNELS", "avx512vnni")
    with pytest.raises(ValueError, match="this CPU runs avx2, generic"):
        int_path()


def test_a_bad_path_setting_is_refused(fresh_path_choice: pytest.MonkeyPatch) -> None:
    fresh_path_choice.setenv("LLMFLEET_INT_KERNELS", "avx9")
    with pytest.raises(ValueError, match="LLMFLEET_INT_KERNELS"):
        int_path()
