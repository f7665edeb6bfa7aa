"""The numeric building blocks of the forward pass: RMSNorm, RoPE, SwiGLU, causal attention."""

from __future__ import annotations

import numpy as np


def linear(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x @ weight.T for x (N, in) and weight (out, in), as (weight @ x.T).T: faster on OpenBLAS; column-major result."""
    return (weight @ x.T).T  # (N, out), Fortran-ordered: callers that need rows contiguous copy it


def rms_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """Root-mean-square normalisation over the last axis (the norm's weight is folded into the next matmul)."""
    scale = np.einsum("nd,nd->n", x, x)[:, None]  # (N, 1)
    scale *= 1.0 / x.shape[1]
    scale += eps
    np.sqrt(scale, out=scale)
    return x / scale  # (N, D)


class RotaryTable:
    """Cosine/sine tables for rotary position embeddings in half-rotation (NEOX) form."""

    def __init__(self, rope_dim: int, base: float, max_positions: int) -> None:
        self.rope_dim = rope_dim
        inv_freq = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)  # (R/2,)
        angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, R/2)
        self.cos = np.cos(angles).astype(np.float32)  # (P, R/2)
        self.sin = np.sin(angles).astype(np.float32)  # (P, R/2)

    def angles(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cosines and sines for the given positions, shaped to broadcast over heads."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]  # (N, 1, R/2) x2

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
        """Rotate the first rope_dim features of every head of x (N, H, Dh) in place."""
        half = self.rope_dim // 2
        x1 = x[:, :, :half]  # (N, H, R/2) view
        x2 = x[:, :, half : self.rope_dim]  # (N, H, R/2) view
        x1_old = x1.copy()  # (N, H, R/2)
        x1 *= cos
        x1 -= x2 * sin  # (N, H, R/2)
        x2 *= cos
        x2 += x1_old * sin  # (N, H, R/2)


def swiglu(gate_up: np.ndarray) -> np.ndarray:
    """SiLU(gate) * up for a fused (N, 2F) gate/up projection."""
    f = gate_up.shape[1] // 2
    gate = gate_up[:, :f]  # (N, F)
    up = gate_up[:, f:]  # (N, F)
    return gate / (1.0 + np.exp(-gate)) * up  # (N, F)


def softmax_inplace(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, computed in place."""
    scores -= scores.max(axis=-1, keepdims=True)  # (..., L)
    np.exp(scores, out=scores)  # (..., L)
    scores /= scores.sum(axis=-1, keepdims=True)  # (..., L)
    return scores


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int) -> np.ndarray:
    """Causal grouped-query attention of T new (pre-scaled) queries over a sequence's L = past + T cached keys."""
    t, n_heads, head_dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    if t == 1:
        qg = q.reshape(n_kv, group, head_dim)  # (Hkv, G, Dh)
        scores = np.matmul(qg, keys.transpose(0, 2, 1))  # (Hkv, G, L)
        probs = softmax_inplace(scores)  # (Hkv, G, L)
        return np.matmul(probs, values).reshape(1, n_heads * head_dim)  # (1, H*Dh)
    qg = q.reshape(t, n_kv, group, head_dim).transpose(1, 2, 0, 3)  # (Hkv, G, T, Dh)
    scores = np.matmul(qg, keys[:, None].transpose(0, 1, 3, 2))  # (Hkv, G, T, L)
    length = keys.shape[1]
    future = np.arange(length)[None, :] > (past + np.arange(t))[:, None]  # (T, L)
    scores[:, :, future] = -np.inf
    probs = softmax_inplace(scores)  # (Hkv, G, T, L)
    out = np.matmul(probs, values[:, None])  # (Hkv, G, T, Dh)
    return out.transpose(2, 0, 1, 3).reshape(t, n_heads * head_dim)  # (T, H*Dh)


def attend_decode_batch(q: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray]) -> np.ndarray:
    """Attention of one new (pre-scaled) query per sequence over each sequence's own keys, softmax batched."""
    b, n_heads, head_dim = q.shape
    n_kv = keys[0].shape[0]
    group = n_heads // n_kv
    lengths = [k.shape[1] for k in keys]
    qg = q.reshape(b, n_kv, group, head_dim)  # (B, Hkv, G, Dh)
    scores = np.full((b, n_kv, group, max(lengths)), -np.inf, np.float32)  # (B, Hkv, G, Lmax)
    for i, k in enumerate(keys):
        scores[i, :, :, : lengths[i]] = np.matmul(qg[i], k.transpose(0, 2, 1))  # (Hkv, G, L_i)
    probs = softmax_inplace(scores)  # (B, Hkv, G, Lmax)
    out = np.empty((b, n_kv, group, head_dim), np.float32)  # (B, Hkv, G, Dh)
    for i, v in enumerate(values):
        np.matmul(probs[i, :, :, : lengths[i]], v, out=out[i])  # (Hkv, G, Dh)
    return out.reshape(b, n_heads * head_dim)  # (B, H*Dh)
