"""worker.engine.kernels.interleaved_k_matmul and interleaved_k_blocks: Q4_K, Q5_K and Q6_K interleaved sixteen rows at a time hold
the file's codes and tables exactly, and their integer matmuls equal the numpy reference bit for bit at every row
count, on every instruction path this CPU has; a row's result does not depend on the rest of its step; the result
stays close to float arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.kernel_paths import assert_every_path_gives, outputs_on_every_path
from tests.support.quant_data import random_blocks
from worker.engine.kernels import interleaved_k_matmul, k_activations
from worker.engine.kernels.interleaved_k_reference import reference_matmul
from worker.engine.weights.interleaved_k_blocks import INTERLEAVED_K_KINDS, InterleavedK, interleave_k
from worker.engine.weights.k_blocks import KBlocks, decode_k_blocks

ROW_COUNTS = (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 36, 64, 70)


def decoded(kind: str, rows: int, cols: int, seed: int) -> KBlocks:
    """A random (rows, cols) matrix of the kind in the file's super-block form, decoded from raw GGUF bytes."""
    return decode_k_blocks(random_blocks(kind, rows, cols, np.random.default_rng(seed)), kind, (rows, cols))


def matrix(kind: str, rows: int, cols: int, seed: int) -> InterleavedK:
    """The same matrix interleaved."""
    return interleave_k(decoded(kind, rows, cols, seed))


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
    rows = k_activations.quantize_rows(x)
    for got, expected in zip(rows, k_activations.reference_quantize(x)):
        np.testing.assert_array_equal(got, expected)
    q, dx, sums32, offsets = rows
    assert dx.shape == (5, 8) and sums32.shape == (5, 16) and offsets.shape == (5, 64)
    assert sums32.dtype == np.int16 and offsets.dtype == np.int32
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and not dx[-1, :4].any() and not q[-1, :256].any()
    np.testing.assert_allclose(q[2].reshape(8, 64) * dx[2][:, None], x[2].reshape(8, 64), atol=float(dx[2].max()))
    np.testing.assert_array_equal(sums32[3], q[3].reshape(16, 32).sum(axis=1))
    np.testing.assert_array_equal(offsets[3], -32 * q[3].reshape(64, 8).sum(axis=1))


@pytest.mark.parametrize("kind", INTERLEAVED_K_KINDS)
def test_interleaving_keeps_codes_tables_and_weights(kind: str) -> None:
    """37 rows (a padded last group): the codes and float32 weights come back exactly, in the file's bytes a weight
    but for its sub-scales and mins (a byte each); d and dmin as float16, as the file holds them."""
    plain = decoded(kind, 37, 512, 1)
    blocks = interleave_k(plain)
    assert blocks.shape == (37, 512) and blocks.low.shape == (3, 2, 32, 64) and blocks.kind == kind
    assert (blocks.high is None) == (kind == "Q4_K") and (blocks.mins is None) == (kind == "Q6_K")
    if blocks.high is not None:
        assert blocks.high.shape == (3, 2, 8 if kind == "Q5_K" else 16, 64)
    np.testing.assert_array_equal(blocks.code_rows(), plain.code_rows())
    np.testing.assert_array_equal(blocks.dequantize(), plain.dequantize())
    index = np.array([36, 0, 17, 17])
    np.testing.assert_array_equal(blocks.rows(index), plain.rows(index))
    assert blocks.d.dtype == np.uint16 and (blocks.dmin is None or blocks.dmin.dtype == np.uint16)
    halved = 2 * (1 if kind == "Q6_K" else 2) / 256  # bytes a weight float16 d (and dmin) save on KBlocks' float32
    assert blocks.nbytes / (48 * 512) == pytest.approx(plain.nbytes / (37 * 512) - halved)  # rows padded


@pytest.mark.parametrize("kind", INTERLEAVED_K_KINDS)
def test_scales_no_float16_holds_stay_float32_and_both_forms_compute_alike(kind: str) -> None:
    """A factor folded into d at load: 2 keeps every d a float16 (float16 bits stored), 1/sqrt(128) does not
    (float32 stored); each form holds the weights exactly and meets the reference bit for bit."""
    plain = decoded(kind, 37, 512, 8)
    for factor, dtype in ((2.0, np.uint16), (1 / np.sqrt(128), np.float32)):
        scaled = plain.scaled(np.float32(factor))
        blocks = interleave_k(scaled)
        assert blocks.d.dtype == dtype and (blocks.dmin is None or blocks.dmin.dtype == dtype)
        np.testing.assert_array_equal(blocks.dequantize(), scaled.dequantize())
        for n in (1, 3, 17):
            x = activations(n, 512, n)
            np.testing.assert_array_equal(interleaved_k_matmul.interleaved_k_matmul(x, blocks),
                                          reference_matmul(x, blocks))


@pytest.mark.parametrize("kind", INTERLEAVED_K_KINDS)
def test_every_row_count_equals_the_reference_bit_for_bit(kind: str) -> None:
    blocks = matrix(kind, 37, 512, 2)  # an odd number of weight rows
    for n in ROW_COUNTS:
        x = activations(n, 512, n)
        np.testing.assert_array_equal(interleaved_k_matmul.interleaved_k_matmul(x, blocks),
                                      reference_matmul(x, blocks), err_msg=f"{kind} {n} rows")


@pytest.mark.parametrize("kind", INTERLEAVED_K_KINDS)
def test_a_rows_result_is_the_same_alone_and_among_others(kind: str) -> None:
    blocks = matrix(kind, 48, 768, 3)
    x = activations(300, 768, 4)  # more than one launch of ROW_CHUNK rows, several passes of X_PASS
    together = interleaved_k_matmul.interleaved_k_matmul(x, blocks)  # (300, 48)
    for k in (0, 1, 31, 32, 33, 255, 256, 299):
        np.testing.assert_array_equal(interleaved_k_matmul.interleaved_k_matmul(x[k : k + 1], blocks)[0], together[k])
    np.testing.assert_array_equal(interleaved_k_matmul.interleaved_k_matmul(x[29:35], blocks), together[29:35])


def largest(kind: str) -> InterleavedK:
    """A (32, 512) matrix with every code and sub-scale at its largest (Q6_K's int8 sub-scales at -128)."""
    rows, cols = 32, 512
    supers = cols // 256
    codes, d = np.full((rows, cols // 2), 0xFF, np.uint8), np.full((rows, supers), 0.01, np.float32)
    if kind == "Q6_K":
        plain = KBlocks(kind, codes, np.full((rows, cols // 16), -128, np.int8), d,
                        high=np.full((rows, cols // 4), 0xFF, np.uint8))
    else:
        fifth = np.full((rows, cols // 8), 0xFF, np.uint8) if kind == "Q5_K" else None
        plain = KBlocks(kind, codes, np.full((rows, cols // 32), 63, np.uint8), d, high=fifth,
                        mins=np.full((rows, cols // 32), 63, np.uint8), dmin=np.full((rows, supers), 0.02, np.float32))
    return interleave_k(plain)


@pytest.mark.parametrize("kind", INTERLEAVED_K_KINDS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_codes_and_activations_stay_exact(kind: str, sign: float) -> None:
    """Every code and sub-scale at its largest and every activation at +-127: Q4_K's sums of 16 products (16 * 15 *
    127) and Q5_K's of 8 (8 * 31 * 127) stay within vpdpwssd's int16, and every quarter's integer sum within int32."""
    blocks = largest(kind)
    x = np.full((20, 512), sign, np.float32)  # (20, 512)
    np.testing.assert_array_equal(interleaved_k_matmul.interleaved_k_matmul(x, blocks),
                                  reference_matmul(x, blocks))


@pytest.mark.parametrize("kind", INTERLEAVED_K_KINDS)
def test_close_to_float_arithmetic(kind: str) -> None:
    blocks = matrix(kind, 64, 1024, 5)
    x = np.random.default_rng(6).standard_normal((3, 1024)).astype(np.float32)  # (3, 1024)
    exact = x.astype(np.float64) @ blocks.dequantize().T.astype(np.float64)  # (3, 64)
    error = np.abs(interleaved_k_matmul.interleaved_k_matmul(x, blocks) - exact).max() / np.abs(exact).max()
    assert error < 0.02


def test_a_matrix_that_does_not_fit_x_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        interleaved_k_matmul.interleaved_k_matmul(np.ones((2, 256), np.float32), matrix("Q4_K", 16, 512, 1))


def test_a_matrix_built_in_memory_meets_the_kernel_warm_compiled() -> None:
    """numba types a read-only array apart from a writeable one; a matrix's arrays are read-only however it was made
    (mapped from the repack cache, or built here at load), so warm() compiles each kind's kernel once per scale type
    and nothing compiles on a first request (the compiles once doubled for each mix of writeable and read-only
    arrays)."""
    interleaved_k_matmul.warm()
    kernels = interleaved_k_matmul._KERNELS
    assert sorted(kernels) == sorted(INTERLEAVED_K_KINDS)
    assert all(len(kernel.signatures) == 2 for kernel in kernels.values())  # float16 and float32 d (~12 s each cold)
    for kind in INTERLEAVED_K_KINDS:
        built = matrix(kind, 32, 512, seed=7)
        mapped = {name: array.copy() for name, array in built.arrays().items()}  # as the repack cache maps them
        for array in mapped.values():
            array.flags.writeable = False
        for held in (built, InterleavedK(kind, out=built.out, **mapped)):
            assert not any(array.flags.writeable for array in held.arrays().values())
            for rows in (1, 3, 9, 40):  # 40 x 512 activations are quantized before the launch, the rest in it
                x = activations(rows, 512, seed=rows)
                x.flags.writeable = rows > 3  # a read-only x as well
                interleaved_k_matmul.interleaved_k_matmul(x, held)
    assert all(len(kernel.signatures) == 2 for kernel in kernels.values())


def test_warm_compiles_only_the_forms_a_model_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's load warms the kinds and scale types its matrices have, not all six (each a cold compile)."""
    held = [matrix("Q6_K", 32, 512, seed=1), matrix("Q6_K", 16, 256, seed=2), "not a K-quant matrix"]
    calls: list[tuple[str, np.dtype]] = []
    monkeypatch.setattr(interleaved_k_matmul, "interleaved_k_matmul",
                        lambda x, blocks: calls.append((blocks.kind, blocks.d.dtype)))
    interleaved_k_matmul.warm(held)
    assert calls == [("Q6_K", held[0].d.dtype)] * 2  # x both ways, once for the two matrices of one form


def test_every_path_gives_the_same_bits(tmp_path: Path) -> None:
    """LLMFLEET_INT_KERNELS forces each path (vpdpbusd on avx512vnni, vpmaddubsw on avx2, portable vector code on
    generic); every path this CPU has gives the reference's bits, the largest codes and activations included."""
    body = (
        "from tests.worker.engine.kernels.test_interleaved_k_matmul import matrix, activations, largest\n"
        "from worker.engine.kernels import interleaved_k_matmul\n"
        "from worker.engine.weights.interleaved_k_blocks import INTERLEAVED_K_KINDS\n"
        "outputs = [interleaved_k_matmul.interleaved_k_matmul(activations(n, 512, n), matrix(kind, 25, 512, 7))\n"
        "           for kind in INTERLEAVED_K_KINDS for n in (1, 3, 4, 5, 33)]\n"
        "outputs += [interleaved_k_matmul.interleaved_k_matmul(np.full((3, 512), sign, np.float32), largest(kind))\n"
        "            for kind in INTERLEAVED_K_KINDS for sign in (1.0, -1.0)]\n"
    )
    expected = [reference_matmul(activations(n, 512, n), matrix(kind, 25, 512, 7))
                for kind in INTERLEAVED_K_KINDS for n in (1, 3, 4, 5, 33)]
    expected += [reference_matmul(np.full((3, 512), sign, np.float32), largest(kind))
                 for kind in INTERLEAVED_K_KINDS for sign in (1.0, -1.0)]
    assert_every_path_gives(outputs_on_every_path(tmp_path, body), expected)
