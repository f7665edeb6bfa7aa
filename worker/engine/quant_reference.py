"""The numpy reference of quant_matmul.py: what every integer kernel must compute, written the plain way.

Activations are quantized exactly as the kernel does (per row and per 16: d = max|x| / 127, q = rint(x / d));
weights are dequantized by gguf's own numpy code (an implementation independent of the kernel's unpacking); the
product of the two dequantized matrices is taken in float64. A kernel agrees with it up to float32 rounding.
"""

from __future__ import annotations

import numpy as np

QBLOCK = 16  # activations per int8 scale, as the kernel


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (K, C) -> int8 codes (K, C) and float32 scales (K, C/16), as the kernel computes them."""
    x = np.asarray(x, np.float32)  # (K, C)
    n, cols = x.shape
    blocks = x.reshape(n, cols // QBLOCK, QBLOCK)  # (K, C/32, 32)
    d = np.abs(blocks).max(axis=-1) / np.float32(127.0)  # (K, C/16)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)  # (K, C/16)
    q = np.rint(blocks * inv[:, :, None]).astype(np.int8)  # (K, C/32, 32)
    return q.reshape(n, cols), d.astype(np.float32)


def dequantize_activations(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The float64 values int8 codes (K, C) and scales (K, C/16) stand for: (K, C)."""
    n, cols = q.shape
    return (q.reshape(n, cols // QBLOCK, QBLOCK).astype(np.float64) * d[:, :, None]).reshape(n, cols)  # (K, C)


def dequantize_weights(raw: np.ndarray, kind: str) -> np.ndarray:
    """gguf's dequantization of raw rows (R, bytes per row) of a type name: (R, C) float64."""
    import gguf
    from gguf.quants import dequantize

    return dequantize(np.asarray(raw), gguf.GGMLQuantizationType[kind]).astype(np.float64)  # (R, C)


def reference_matmul(x: np.ndarray, kind: str, raw: np.ndarray) -> np.ndarray:
    """What quant_matmul(x, kind, raw) computes, in float64: quantized x (K, C) times dequantized W.T: (K, R)."""
    q, d = quantize_activations(x)
    return dequantize_activations(q, d) @ dequantize_weights(raw, kind).T  # (K, R)
