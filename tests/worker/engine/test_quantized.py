"""A QuantizedLinear's two forms stay the same matrix through every load-time transform, and ops.linear gives
the same product whichever form a step's width picks."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine import ops
from worker.engine.architectures.common import fold_norm, fuse_rows, scale_rows, unpermute_rope_rows
from worker.engine.quant_blocks import BlockCodes
from worker.engine.quantized import QuantizedLinear


def random_linear(rng: np.random.Generator, out_dim: int, in_dim: int, group: int = 32) -> QuantizedLinear:
    """A random block-coded projection with its float32 form."""
    blocks = BlockCodes(rng.integers(0, 16, (out_dim, in_dim), dtype=np.uint8),
                        rng.uniform(0.01, 0.1, (out_dim, in_dim // group)).astype(np.float32),
                        rng.uniform(-0.5, 0.5, (out_dim, in_dim // group)).astype(np.float32), group)
    return QuantizedLinear(blocks.dequantize(), blocks)


def block_product(x: np.ndarray, weight: QuantizedLinear) -> np.ndarray:
    """x @ W.T through the block form (what a narrow step computes)."""
    narrow = ops.narrow_rows()
    ops.set_block_rows(x.shape[0])
    try:
        return ops.linear(x, weight)  # (N, out)
    finally:
        ops.set_block_rows(narrow)


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_transforms_keep_both_forms_the_same_matrix(rows: int) -> None:
    rng = np.random.default_rng(rows)
    q, k = random_linear(rng, 64, 96), random_linear(rng, 32, 96)
    v = random_linear(rng, 32, 96, group=16)
    norm = rng.uniform(0.5, 1.5, 96).astype(np.float32)  # (in,)
    fused = fold_norm(fuse_rows(scale_rows(unpermute_rope_rows(q, 4), np.float32(0.25)), unpermute_rope_rows(k, 2), v),
                      norm)
    assert isinstance(fused, QuantizedLinear) and fused.blocks.group == 16 and fused.shape == (128, 96)
    reference = fold_norm(fuse_rows(scale_rows(unpermute_rope_rows(q.dense, 4), np.float32(0.25)),
                                    unpermute_rope_rows(k.dense, 2), v.dense), norm)  # (128, 96) the float32 path
    np.testing.assert_allclose(fused.dense, reference, rtol=1e-6)
    x = rng.standard_normal((rows, 96)).astype(np.float32)  # (N, in)
    np.testing.assert_allclose(block_product(x, fused), x @ reference.T, rtol=1e-4, atol=1e-4)


def test_wide_steps_use_the_float32_form_and_agree() -> None:
    rng = np.random.default_rng(3)
    weight = random_linear(rng, 48, 64)
    x = rng.standard_normal((16, 64)).astype(np.float32)  # (N, in): wider than the block path
    wide = ops.linear(x, weight)  # (N, out) through BLAS
    np.testing.assert_allclose(wide, block_product(x, weight), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ops.linear_rows(x[:2], weight), x[:2] @ weight.dense.T, rtol=1e-4, atol=1e-4)


def test_mixed_fusing_falls_back_to_float32() -> None:
    rng = np.random.default_rng(4)
    q = random_linear(rng, 16, 64)
    plain = rng.standard_normal((8, 64)).astype(np.float32)
    fused = fuse_rows(q, plain)
    assert isinstance(fused, np.ndarray)
    np.testing.assert_array_equal(fused, np.concatenate([q.dense, plain]))
