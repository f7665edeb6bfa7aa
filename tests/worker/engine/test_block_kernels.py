"""worker.engine.block_kernels: both block-code matmul kernels agree with the float32 matmul."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine import block_kernels


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 13, 16, 20, 23])
@pytest.mark.parametrize("out_dim", [40, 37])
def test_block_matmul_equals_the_dequantized_matmul(group: int, rows: int, out_dim: int) -> None:
    """Each group size has its own narrow kernel (a cached closure): both agree with float32, for rows taken
    eight, four and one at a time (13 = an eight, a four and a single); from 16 rows the wide kernel, in sixes and
    singles (23 = three sixes and five singles), over weight tiles ending in a partial one with an odd row (37)."""
    rng = np.random.default_rng(group + rows)
    in_dim = 8 * group
    codes = rng.integers(0, 64, (out_dim, in_dim), dtype=np.uint8)  # (out, in)
    scale = rng.uniform(-0.1, 0.1, (out_dim, in_dim // group)).astype(np.float32)  # (out, in/G)
    offset = rng.uniform(-1, 1, (out_dim, in_dim // group)).astype(np.float32)  # (out, in/G)
    weight = (codes.reshape(out_dim, -1, group) * scale[:, :, None] + offset[:, :, None]).reshape(out_dim, in_dim)
    x = rng.standard_normal((rows, in_dim)).astype(np.float32)  # (N, in)
    got = block_kernels.block_matmul(x, codes, scale, offset)  # (N, out)
    assert got.shape == (rows, out_dim) and got.flags.c_contiguous
    np.testing.assert_allclose(got, x @ weight.T, rtol=1e-4, atol=1e-3)
