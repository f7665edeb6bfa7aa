"""worker.engine.kernels.float_matmul: both block-code matmul kernels agree with the float32 matmul."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine.kernels import float_matmul


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
    got = float_matmul.block_matmul(x, codes, scale, offset)  # (N, out)
    assert got.shape == (rows, out_dim) and got.flags.c_contiguous
    np.testing.assert_allclose(got, x @ weight.T, rtol=1e-4, atol=1e-3)


def _random_blocks(rng: np.random.Generator, out_dim: int, in_dim: int, group: int):  # type: ignore[no-untyped-def]
    """Random 8-bit codes (out, in) with per-group scale and offset tables (out, in/G)."""
    codes = rng.integers(0, 256, (out_dim, in_dim), dtype=np.uint8)  # (out, in)
    scale = rng.uniform(-0.02, 0.02, (out_dim, in_dim // group)).astype(np.float32)  # (out, in/G)
    offset = rng.uniform(-1, 1, (out_dim, in_dim // group)).astype(np.float32)  # (out, in/G)
    return codes, scale, offset


@pytest.mark.parametrize("group", [16, 32])
def test_every_row_of_a_step_is_the_row_computed_alone(group: int) -> None:
    """Batch invariance, bit for bit: row k of a K-row step (K = 1..80 and a 200-row prefill: the narrow kernel's
    eights, fours and singles, the wide kernel's sixes, fours and singles, odd weight tiles) equals that row of x
    multiplied alone (the one-row narrow kernel)."""
    rng = np.random.default_rng(group)
    out_dim, in_dim = 45, 12 * group  # 45: partial tiles of 4 and of 8 weight rows, with an odd last row
    codes, scale, offset = _random_blocks(rng, out_dim, in_dim, group)
    x = (rng.standard_normal((200, in_dim)) * rng.uniform(0.1, 10, (200, 1))).astype(np.float32)  # (200, in)
    alone = np.concatenate([float_matmul.block_matmul(x[k : k + 1], codes, scale, offset) for k in range(200)])
    for rows in [*range(1, 81), 200]:
        start = (7 * rows) % (200 - rows + 1)  # the rows sit at different places of the step
        got = float_matmul.block_matmul(x[start : start + rows], codes, scale, offset)  # (K, out)
        assert np.array_equal(got, alone[start : start + rows]), f"{rows} rows differ from the rows alone"
    weight = (codes.reshape(out_dim, -1, group) * scale[:, :, None] + offset[:, :, None]).reshape(out_dim, in_dim)
    np.testing.assert_allclose(alone, x @ weight.T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("in_dim", [64, 20])
def test_float_matmul_is_row_invariant_and_matches_numpy(in_dim: int) -> None:
    """The float32 kernel (float weights, LoRA factors) follows the same rule: every row of a K-row product equals
    the row alone, for widths that are a multiple of 8 and one padded with zero columns (20)."""
    rng = np.random.default_rng(in_dim)
    weight = rng.standard_normal((37, in_dim)).astype(np.float32)  # (out, in)
    x = rng.standard_normal((90, in_dim)).astype(np.float32)  # (90, in)
    alone = np.concatenate([float_matmul.float_matmul(x[k : k + 1], weight) for k in range(90)])  # (90, out)
    for rows in (1, 2, 5, 8, 13, 16, 30, 64, 90):
        assert np.array_equal(float_matmul.float_matmul(x[:rows], weight), alone[:rows]), rows
    np.testing.assert_allclose(alone, x @ weight.T, rtol=1e-4, atol=1e-4)
