"""The encoder's compiled kernels against numpy's definitions (ops.py's attention, LayerNorm and GELU)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine import ops
from worker.engine.kernels.encoder_layers import add_layer_norm, attend_texts, bias_gelu


def test_attention_keeps_each_text_to_its_own_rows() -> None:
    rng = np.random.default_rng(0)
    n_heads, head_dim = 3, 8
    lengths = np.array([1, 7, 3, 12, 2])  # (B,)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (B+1,)
    inner = n_heads * head_dim
    qkv_t = rng.standard_normal((3 * inner, int(starts[-1]))).astype(np.float32)  # (3*H*Dh, N)
    bias = rng.standard_normal(3 * inner).astype(np.float32)  # (3*H*Dh,)
    qkv = qkv_t.T + bias  # (N, 3*H*Dh)
    q, k, v = (np.ascontiguousarray(qkv[:, i * inner:(i + 1) * inner].reshape(-1, n_heads, head_dim))
               for i in range(3))  # (N, H, Dh) each
    expected = ops.attend_bidirectional(q, k, v, starts)  # (N, H*Dh)
    got = attend_texts(qkv_t, bias, starts, n_heads, head_dim)  # (N, H*Dh)
    np.testing.assert_allclose(got, expected, atol=2e-5)
    moved = qkv_t.copy()
    moved[:, starts[3]:] += 5.0  # another text's rows change: the first three texts do not
    np.testing.assert_array_equal(attend_texts(moved, bias, starts, n_heads, head_dim)[:starts[3]], got[:starts[3]])


@pytest.mark.parametrize("column_major", [False, True])
def test_add_layer_norm_is_the_residual_then_layer_norm(column_major: bool) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((37, 24)).astype(np.float32)  # (N, D): not a whole number of row blocks
    y = rng.standard_normal((37, 24)).astype(np.float32)  # (N, D)
    if column_major:
        y = np.asfortranarray(y)  # as ops.linear returns it
    bias, weight, norm_bias = (rng.standard_normal(24).astype(np.float32) for _ in range(3))  # (D,)
    expected = ops.layer_norm(x + y + bias, weight, norm_bias, 1e-12)  # (N, D)
    got = add_layer_norm(x, y, bias, weight, norm_bias, 1e-12)
    assert got is x
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_bias_gelu_is_ggmls_tanh_gelu() -> None:
    rng = np.random.default_rng(2)
    h = (rng.standard_normal((5, 1029)) * 4).astype(np.float32)  # (F, N): a ragged last chunk and tail lanes
    h[0, :4] = [-100.0, 100.0, 0.0, -3.0]  # saturated and exact values
    bias = rng.standard_normal(5).astype(np.float32)  # (F,)
    expected = ops.gelu_tanh_inplace((h + bias[:, None]).astype(np.float32))  # (F, N)
    got = bias_gelu(h, bias)
    np.testing.assert_allclose(got, expected, atol=2e-6, rtol=1e-5)
