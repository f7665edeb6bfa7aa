"""The float64 reference of Qwen3.5's two mixers (tests/support/reference_forward.py calls them), written from
llama.cpp's qwen35.cpp and delta-net-base.cpp and ggml-cpu's ssm_conv and gated_delta_net: the delta rule runs token by
token from a zero state over the whole sequence, the convolution over the sequence padded with K-1 zero rows."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def delta_net(t: dict[str, np.ndarray], p: str, x: np.ndarray, meta: dict, eps: float) -> np.ndarray:
    """A gated delta-net layer's output (T, D) for normed inputs x (T, D)."""
    n = x.shape[0]
    hk, hv, dk = int(meta["ssm.group_count"]), int(meta["ssm.time_step_rank"]), int(meta["ssm.state_size"])
    taps = t[p + "ssm_conv1d.weight"]  # (C, K)
    mixed = x @ t[p + "attn_qkv.weight"].T  # (T, C)
    padded = np.concatenate([np.zeros((taps.shape[1] - 1, mixed.shape[1])), mixed])  # (K-1+T, C)
    conv = np.stack([(padded[i : i + taps.shape[1]] * taps.T).sum(0) for i in range(n)])  # (T, C)
    conv = conv / (1.0 + np.exp(-conv))  # SiLU
    q = conv[:, : hk * dk].reshape(n, hk, dk)  # (T, Hk, Dk)
    k = conv[:, hk * dk : 2 * hk * dk].reshape(n, hk, dk)  # (T, Hk, Dk)
    v = conv[:, 2 * hk * dk :].reshape(n, hv, dk)  # (T, Hv, Dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)  # L2 norm
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    beta = 1.0 / (1.0 + np.exp(-(x @ t[p + "ssm_beta.weight"].T)))  # (T, Hv)
    alpha = x @ t[p + "ssm_alpha.weight"].T + t[p + "ssm_dt.bias"]  # (T, Hv)
    decay = np.exp(np.log1p(np.exp(alpha)) * t[p + "ssm_a"])  # (T, Hv)
    out = np.zeros((n, hv, dk))  # (T, Hv, Dv)
    for h in range(hv):
        kh = h % hk  # value heads read the key heads tiled (the converter reorders them so)
        state = np.zeros((dk, dk))  # (Dk, Dv): S[i, j], key i, value j
        for step in range(n):
            state = state * decay[step, h]
            error = v[step, h] - k[step, kh] @ state  # (Dv,)
            state = state + np.outer(k[step, kh], error * beta[step, h])
            out[step, h] = q[step, kh] @ state / math.sqrt(dk)
    out = out / np.sqrt((out * out).mean(-1, keepdims=True) + eps) * t[p + "ssm_norm.weight"]  # (T, Hv, Dv)
    z = (x @ t[p + "attn_gate.weight"].T).reshape(n, hv, dk)  # (T, Hv, Dv)
    out = out * (z / (1.0 + np.exp(-z)))
    return out.reshape(n, hv * dk) @ t[p + "ssm_out.weight"].T  # (T, D)


def gated_attention(t: dict[str, np.ndarray], p: str, x: np.ndarray, heads: tuple[int, int, int],
                    rms: Callable[[np.ndarray, np.ndarray], np.ndarray],
                    rope: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """A gated attention layer's output (T, D) for normed inputs x (T, D): per head, the query projection's first
    Dh rows are the query and the next Dh the gate."""
    n, (h, hkv, dh) = x.shape[0], heads
    query_gate = (x @ t[p + "attn_q.weight"].T).reshape(n, h, 2, dh)  # (T, H, 2, Dh)
    q, gate = rms(query_gate[:, :, 0], t[p + "attn_q_norm.weight"]), query_gate[:, :, 1]  # (T, H, Dh) each
    k = rms((x @ t[p + "attn_k.weight"].T).reshape(n, hkv, dh), t[p + "attn_k_norm.weight"])  # (T, Hkv, Dh)
    v = (x @ t[p + "attn_v.weight"].T).reshape(n, hkv, dh)  # (T, Hkv, Dh)
    q, k = rope(q), rope(k)
    k, v = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)  # (T, H, Dh) each
    scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(dh) + np.triu(np.full((n, n), -np.inf), 1)  # (H, T, T)
    weights = np.exp(scores - scores.max(-1, keepdims=True))  # (H, T, T)
    attended = np.einsum("hts,shd->thd", weights / weights.sum(-1, keepdims=True), v)  # (T, H, Dh)
    attended = attended * (1.0 / (1.0 + np.exp(-gate)))  # (T, H, Dh)
    return attended.reshape(n, h * dh) @ t[p + "attn_output.weight"].T  # (T, D)
