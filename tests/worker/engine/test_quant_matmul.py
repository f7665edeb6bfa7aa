"""worker.engine.quant_matmul: every integer kernel against the numpy reference, and batch invariance."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import quantize

from worker.engine import quant_matmul as qm
from worker.engine import quant_reference as ref

HALF_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of the float16 fields per block


def random_matrix(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw rows (R, bytes per row) of a GGML type: gguf's quantizer where it has one, else random valid blocks."""
    if kind not in HALF_FIELDS:
        weights = rng.standard_normal((rows, cols)).astype(np.float32)  # (R, C)
        return np.ascontiguousarray(quantize(weights, gguf.GGMLQuantizationType[kind]))  # (R, bytes)
    code = qm.KINDS[kind]
    n_blocks, size = cols // qm.BLOCK_WEIGHTS[code], qm.BLOCK_BYTES[code]
    raw = rng.integers(0, 256, (rows, n_blocks, size), dtype=np.uint8)  # (R, nb, bytes per block)
    for at in HALF_FIELDS[kind]:
        halves = rng.uniform(0.001, 0.01, (rows, n_blocks)).astype(np.float16)  # (R, nb)
        raw[:, :, at : at + 2] = halves.view(np.uint8).reshape(rows, n_blocks, 2)
    return raw.reshape(rows, n_blocks * size)  # (R, bytes)


def test_activations_quantize_exactly_as_the_reference() -> None:
    x = np.random.default_rng(0).standard_normal((7, 512)).astype(np.float32) * 3  # (K, C)
    x[2, :16] = 0.0  # an all-zero block: scale 0, codes 0
    got = qm.QuantizedActivations(x)
    q, d = ref.quantize_activations(x)
    assert np.array_equal(got.q, q) and np.array_equal(got.d, d)
    assert np.array_equal(got.sums, q.reshape(7, -1, 16).astype(np.int32).sum(axis=-1))


@pytest.mark.parametrize("kind", sorted(qm.KINDS))
def test_every_kernel_matches_the_numpy_reference_for_1_to_70_rows(kind: str) -> None:
    rng = np.random.default_rng(qm.KINDS[kind])
    raw = random_matrix(kind, 19, 512, rng)  # (R, bytes): 19 rows, a partial last tile
    x = rng.standard_normal((70, 512)).astype(np.float32)  # (K, C)
    whole = qm.quant_matmul(qm.QuantizedActivations(x), kind, raw)  # (70, R)
    expected = ref.reference_matmul(x, kind, raw)  # (70, R)
    scale = np.abs(ref.dequantize_activations(*ref.quantize_activations(x))) @ np.abs(
        ref.dequantize_weights(raw, kind)).T  # (70, R) bound of the rounding error
    assert np.all(np.abs(whole - expected) <= 1e-5 * scale + 1e-6)
    for rows in range(1, 71):
        part = qm.quant_matmul(qm.QuantizedActivations(x[:rows]), kind, raw)  # (rows, R)
        assert np.array_equal(part, whole[:rows]), f"{kind}: {rows} rows differ from the same rows among 70"


def test_a_row_gives_the_same_bits_alone_and_among_500() -> None:
    rng = np.random.default_rng(1)
    raw = random_matrix("Q4_K", 40, 768, rng)  # (R, bytes)
    x = rng.standard_normal((500, 768)).astype(np.float32)  # (K, C)
    many = qm.quant_matmul(qm.QuantizedActivations(x), "Q4_K", raw)  # (500, R)
    for row in (0, 137, 499):
        alone = qm.quant_matmul(qm.QuantizedActivations(x[row : row + 1]), "Q4_K", raw)  # (1, R)
        assert np.array_equal(alone[0], many[row])
