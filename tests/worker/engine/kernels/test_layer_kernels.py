"""The compiled paged decode attention (float16 and float32 arenas) against the numpy reference on gathered, masked
arrays; SwiGLU, the KV row store and the rotary embedding against numpy, bit for bit."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from worker.engine import ops
from worker.engine.kernels import layer_kernels


def _reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, tables: np.ndarray, lengths: np.ndarray,
               first: np.ndarray) -> np.ndarray:
    """Gather every row's blocks into a padded batch and attend with an additive mask (ops.attend_decode)."""
    n_kv, _, block_size, head_dim = keys.shape
    b, nb = tables.shape
    gathered_k = np.take(keys.astype(np.float32), tables, axis=1).reshape(n_kv, b, nb * block_size, head_dim)  # (Hkv, B, L, Dh)
    gathered_v = np.take(values.astype(np.float32), tables, axis=1).reshape(n_kv, b, nb * block_size, head_dim)  # (Hkv, B, L, Dh)
    key_pos = np.arange(nb * block_size)[None, :]  # (1, L)
    hidden = (key_pos >= lengths[:, None]) | (key_pos < first[:, None])  # (B, L)
    mask = np.where(hidden, -np.inf, 0.0).astype(np.float32)  # (B, L)
    return ops.attend_decode(q, gathered_k, gathered_v, mask)  # (B, H*Dh)


@pytest.mark.parametrize("window", [0, 5, 40])
@pytest.mark.parametrize("n_heads,n_kv", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_paged_decode_matches_gathered_reference(window: int, n_heads: int, n_kv: int, head_dim: int,
                                                 dtype: type) -> None:
    """Random block tables (blocks shared between rows, as after a prefix hit) and ragged lengths agree, in the
    vector kernel (head_dim a multiple of 32) and the scalar one (16), over both pool dtypes."""
    rng = np.random.default_rng(window * 31 + n_heads + head_dim)
    block_size, n_blocks, rows = 8, 40, 6
    keys = rng.standard_normal((n_kv, n_blocks, block_size, head_dim)).astype(dtype)  # as the pool keeps them
    values = rng.standard_normal((n_kv, n_blocks, block_size, head_dim)).astype(dtype)
    lengths = rng.integers(1, 9 * block_size, rows).astype(np.int64)
    lengths[0] = 1
    width = int(-(-lengths.max() // block_size))
    tables = rng.integers(1, n_blocks, (rows, width)).astype(np.int64)
    tables[1, :2] = tables[2, :2]  # a shared prefix
    first = np.maximum(lengths - window, 0) if window else np.zeros_like(lengths)
    q = (rng.standard_normal((rows, n_heads, head_dim)) / 4).astype(np.float32)
    got = ops.paged_attend_decode(q, keys, values, tables, lengths, first)
    want = _reference(q, keys, values, tables, lengths, first)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim", [16, 64])
def test_attention_sinks_join_each_softmax_denominator_only(head_dim: int) -> None:
    """gpt-oss's sinks: a per-head logit in the softmax whose value row is zero (a key no query's output reads)."""
    rng = np.random.default_rng(head_dim)
    n_heads, n_kv, block_size = 8, 2, 8
    keys = rng.standard_normal((n_kv, 12, block_size, head_dim)).astype(np.float32)
    values = rng.standard_normal((n_kv, 12, block_size, head_dim)).astype(np.float32)
    lengths = np.array([1, 30, 57], np.int64)
    tables = rng.integers(1, 12, (3, 8)).astype(np.int64)
    first = np.zeros(3, np.int64)
    q = (rng.standard_normal((3, n_heads, head_dim)) / 4).astype(np.float32)
    sinks = rng.uniform(-2, 4, n_heads).astype(np.float32)  # (H,)
    got = ops.paged_attend_decode(q, keys, values, tables, lengths, first, sinks)
    scores = np.einsum("bhd,kbld->bhkl", q.reshape(3, n_kv, n_heads // n_kv, head_dim).reshape(3, n_heads, head_dim),
                       np.take(keys, tables, axis=1).reshape(n_kv, 3, -1, head_dim))  # (B, H, Hkv, L)
    for b in range(3):
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)
            row = np.append(scores[b, h, kv, : lengths[b]].astype(np.float64), sinks[h])  # (L+1,)
            weights = np.exp(row - row.max())
            weights /= weights.sum()
            flat_values = np.take(values, tables[b], axis=1).reshape(n_kv, -1, head_dim)[kv, : lengths[b]]  # (L, Dh)
            want = weights[:-1] @ flat_values  # (Dh,)
            np.testing.assert_allclose(got[b, h * head_dim : (h + 1) * head_dim], want, rtol=1e-5, atol=1e-5)


def test_concurrent_callers_are_serialised() -> None:
    """Two threads calling the parallel kernel at once both get the right answer (the launch lock)."""
    rng = np.random.default_rng(7)
    keys = rng.standard_normal((3, 30, 8, 16)).astype(np.float16)
    values = rng.standard_normal((3, 30, 8, 16)).astype(np.float16)
    tables = rng.integers(0, 30, (4, 5)).astype(np.int64)
    lengths = np.array([40, 3, 17, 33], np.int64)
    first = np.zeros(4, np.int64)
    q = rng.standard_normal((4, 9, 16)).astype(np.float32)
    want = _reference(q, keys, values, tables, lengths, first)
    errors: list[float] = []

    def run() -> None:
        for _ in range(50):
            errors.append(float(np.abs(ops.paged_attend_decode(q, keys, values, tables, lengths, first) - want).max()))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 150 and max(errors) < 1e-5


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
        arena, expected = np.zeros((4, 50, 8, 16), dtype), np.zeros((4, 50, 8, 16), dtype)  # (Hkv, NB, BS, Dh)
        with np.errstate(over="ignore"):
            expected[:, blocks, offsets] = k.transpose(1, 0, 2)  # (Hkv, N, Dh)
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
