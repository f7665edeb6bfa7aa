"""The compiled per-row steps of a layer against numpy: SwiGLU, the KV row store, the rotary embedding (bit for bit)
and RMS normalisation (one fixed order per row)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine import ops
from worker.engine.kernels import layer_kernels
from worker.engine.kv.arena_layout import block_view


@pytest.mark.parametrize("rows,width", [(1, 8), (3, 576), (32, 1536), (2, 261)])
def test_swiglu_kernel_matches_the_formula(rows: int, width: int) -> None:
    """Whole vectors, a scalar tail (261) and a partial last chunk agree with SiLU(gate) * up in float64."""
    from worker.engine.kernels import layer_kernels

    rng = np.random.default_rng(rows + width)
    gate_up = (rng.standard_normal((rows, 2 * width)) * 6).astype(np.float32)  # (N, 2F)
    gate_up[0, :4] = [-100.0, 100.0, 0.0, -20.0]  # saturated ends
    gate, up = gate_up[:, :width].astype(np.float64), gate_up[:, width:].astype(np.float64)
    want = gate / (1.0 + np.exp(-gate)) * up  # (N, F)
    got = layer_kernels.swiglu(gate_up)
    assert got.shape == (rows, width)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with np.errstate(over="ignore"):  # numpy's exp(100) is inf, and gate / inf the right 0
        np.testing.assert_allclose(ops.swiglu(np.asfortranarray(gate_up)), want, rtol=1e-5, atol=1e-5)  # numpy path


@pytest.mark.parametrize("width", [8192, 261])
def test_swiglu_of_a_row_is_the_same_bits_alone_and_in_a_wide_step(width: int) -> None:
    """A decode step's row (in the calling thread) and the same row among many (on the kernel threads)."""
    rng = np.random.default_rng(width)
    gate_up = (rng.standard_normal((layer_kernels.SERIAL_SWIGLU // width + 3, 2 * width)) * 6).astype(np.float32)
    together = layer_kernels.swiglu(gate_up)  # (N, F): over SERIAL_SWIGLU outputs
    for k in (0, len(gate_up) - 1):
        np.testing.assert_array_equal(layer_kernels.swiglu(gate_up[k : k + 1]), together[k : k + 1])


@pytest.mark.parametrize("rows", [1, 16, 300])
def test_row_store_rounds_as_numpy(rows: int) -> None:
    """float32 rows (a strided view, as the step's k and v are) into a float16 arena give numpy's float16 bits,
    overflow, underflow, signed zero and ties included; a float32 arena takes them as they are."""
    rng = np.random.default_rng(rows)
    qkv = rng.standard_normal((rows, 3, 4, 16)).astype(np.float32) * 4  # (N, q|k|v, Hkv, Dh)
    qkv[0, 1, 0] = [7e4, -7e4, 1e-8, -1e-8, 6e-5, 65504, 65520, 0.0, -0.0, 2.9802322e-08, 5.96e-08, 1e-6,
                    1.00048828125, 1.00146484375, 3.0e38, -3.0e-39]  # ties to even, subnormals, beyond float16
    k = qkv[:, 1]  # (N, Hkv, Dh), not contiguous
    slots = rng.choice(50 * 8, rows, replace=False)
    blocks, offsets = slots // 8, slots % 8  # (N,) each, distinct positions
    for dtype in (np.float16, np.float32):
        arena, expected = np.zeros((10, 4, 5, 8, 16), dtype), np.zeros((10, 4, 5, 8, 16), dtype)  # (NG, Hkv, G, BS, Dh)
        with np.errstate(over="ignore"):
            for n in range(rows):
                block_view(expected, blocks[n])[:, offsets[n]] = k[n]  # (Hkv, Dh)
        layer_kernels.store_rows(arena, blocks, offsets, k)
        np.testing.assert_array_equal(arena.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_rotary_kernel_is_the_numpy_passes_bit_for_bit(rows: int) -> None:
    """RotaryTable.apply's compiled loop on a strided (N, H, Dh) view equals its four numpy passes exactly."""
    rng = np.random.default_rng(rows)
    table = ops.RotaryTable(48, 10000.0, 4096)  # rope_dim below head_dim: the rest stays as it was
    qkv = (rng.standard_normal((rows, 7 * 64 + 64)) * 5).astype(np.float32)  # (N, (H + Hkv) * Dh + more)
    x = qkv[:, : 7 * 64].reshape(rows, 7, 64)  # (N, H, Dh) view
    cos, sin = table.angles(rng.integers(0, 4096, rows))  # (N, 1, 24) each
    expected = x.copy()  # (N, H, Dh)
    half = 24
    first, second = expected[:, :, :half], expected[:, :, half:48]
    old = first.copy()
    first *= cos
    first -= second * sin
    second *= cos
    second += old * sin
    table.apply(x, cos, sin)
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("width", [5, 17, 50, 640, 2048])
def test_rms_rows_is_the_formula_and_the_same_row_alone(width: int) -> None:
    """Each row over its root mean square, within float32 rounding of the float64 formula, and bit for bit the same
    alone, among 40 others and as a strided view (ops.rms_normalize's and rms_normalize_heads' compiled path)."""
    rng = np.random.default_rng(width)
    x = (rng.standard_normal((40, width)) * rng.uniform(0.01, 30, (40, 1))).astype(np.float32)  # (40, D)
    together = ops.rms_normalize(x, 1e-5)  # (40, D)
    wide = x.astype(np.float64)
    expected = wide / np.sqrt((wide * wide).mean(axis=1, keepdims=True) + 1e-5)  # (40, D)
    np.testing.assert_allclose(together, expected, rtol=2e-6, atol=1e-7)
    for k in (0, 7, 39):
        np.testing.assert_array_equal(ops.rms_normalize(x[k : k + 1], 1e-5)[0], together[k])
    strided = np.repeat(x, 2, axis=0)[::2]  # (40, D), every other row of a larger array
    np.testing.assert_array_equal(ops.rms_normalize(strided, 1e-5), together)
    heads = ops.rms_normalize_heads(x.reshape(8, 5, width), 1e-5)  # (8, 5, D): rows as heads
    np.testing.assert_array_equal(heads.reshape(40, width), together)
