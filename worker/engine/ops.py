"""Every array operation of the forward pass, in one place: norms, RoPE, activations, attention.

Model and architecture code call only these functions (plus array methods such as reshape), so a second
array backend (CuPy on a GPU) replaces `xp` and this module, not the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.engine import kernels
from worker.engine.quant_matmul import QuantizedActivations
from worker.engine.quantized import QuantizedMatrix

xp: Any = np  # the array module of the forward path
Array = Any  # an array of the backend in `xp`
Weight = Any  # a projection: an (out, in) float array, or a QuantizedMatrix over the file's own bytes
DRAFT_ROWS = 64  # the widest step the scheduler widens with prompt-lookup drafts


def narrow_rows() -> int:
    """The widest step the scheduler widens with drafts (every width runs the same integer kernels)."""
    return DRAFT_ROWS


def weight(matrix: Any) -> Weight:
    """A projection as the forward path takes it: quantized ones as they are, arrays row-major on the backend."""
    return matrix if isinstance(matrix, QuantizedMatrix) else xp.ascontiguousarray(xp.asarray(matrix, dtype=np.float32))


def embedding_rows(matrix: Weight, tokens: Array) -> Array:
    """The float32 rows of an embedding matrix at token ids (N,): (N, D), a new array (quantized rows dequantized
    one by one as they are looked up)."""
    if isinstance(matrix, QuantizedMatrix):
        return matrix.rows(tokens)  # (N, D)
    return matrix[tokens]  # (N, D)


def asarray(values: Any, dtype: Any = None) -> Array:
    """An array of the backend (token ids, positions, indices)."""
    return xp.asarray(values, dtype=dtype)


def empty(shape: tuple[int, ...], dtype: Any = np.float32) -> Array:
    """An uninitialised array of the backend."""
    return xp.empty(shape, dtype)


def linear(x: Array, weight: Weight) -> Array:
    """x @ weight.T for x (N, in) and weight (out, in): (N, out), row-major. A quantized weight goes through the
    integer kernels, a float one row by row through BLAS's matrix-vector product: either way a row's result does
    not depend on the other rows of the step."""
    if isinstance(weight, QuantizedMatrix):
        return weight.matmul(x)  # (N, out)
    out = xp.empty((x.shape[0], weight.shape[0]), np.float32)  # (N, out)
    for i in range(x.shape[0]):  # matrix-vector products: a row's result does not depend on the step's rows
        out[i] = weight @ x[i]  # (out,)
    return out


def linear_parts(x: Array, weights: tuple[Weight, ...]) -> Array:
    """x (N, in) times several projections sharing the input, side by side: (N, sum out_i), row-major; x is
    quantized once for every part with an integer kernel (q, k and v; gate and up)."""
    n = x.shape[0]
    out = xp.empty((n, sum(w.shape[0] for w in weights)), np.float32)  # (N, sum out_i)
    quantized = None
    column = 0
    for w in weights:
        part = out[:, column : column + w.shape[0]]  # (N, out_i) view
        if isinstance(w, QuantizedMatrix) and w.has_kernel:
            quantized = quantized or QuantizedActivations(x)
            w.matmul(quantized, part)
        else:
            part[...] = linear(x, w)  # (N, out_i)
        column += w.shape[0]
    return out


def lora_delta(x: Array, a: Array, b: Array) -> Array:
    """A low-rank update (x @ a.T) @ b.T for x (G, in), a (R, in), b (out, R): (G, out), C-ordered. Row by row
    (two matrix-vector products each), so a row's update does not depend on how many rows share its step (BLAS's
    matrix-matrix kernels round by their blocking)."""
    out = xp.empty((x.shape[0], b.shape[0]), np.float32)  # (G, out)
    for i in range(x.shape[0]):
        out[i] = b @ (a @ x[i])  # (out,)
    return out


def linear_rows(x: Array, weight: Weight) -> Array:
    """x @ weight.T with a row-major result (the logits)."""
    return linear(x, weight)  # (N, out)


def contiguous(x: Array) -> Array:
    """A row-major copy (or x itself when it already is)."""
    return xp.ascontiguousarray(x)


def rms_normalize(x: Array, eps: float) -> Array:
    """Root-mean-square normalisation over the last axis (the norm's weight is folded into the next matmul)."""
    scale = xp.einsum("nd,nd->n", x, x)[:, None]  # (N, 1)
    scale *= 1.0 / x.shape[1]
    scale += eps
    xp.sqrt(scale, out=scale)
    return x / scale  # (N, D)


def rms_normalize_heads(x: Array, eps: float) -> Array:
    """RMS normalisation of every head vector of x (N, H, Dh) over Dh (QK-norm); a new array."""
    scale = xp.einsum("nhd,nhd->nh", x, x)[:, :, None]  # (N, H, 1)
    scale *= 1.0 / x.shape[2]
    scale += eps
    xp.sqrt(scale, out=scale)
    return x / scale  # (N, H, Dh)


def soft_cap(x: Array, cap: float) -> Array:
    """cap * tanh(x / cap), in place (Gemma's logit soft-capping)."""
    x *= 1.0 / cap
    xp.tanh(x, out=x)
    x *= cap
    return x


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    """RMSNorm with its weight applied (for norms that cannot be folded into a following matmul)."""
    return rms_normalize(x, eps) * weight  # (N, D)


class RotaryTable:
    """Cosine/sine tables for rotary position embeddings: half-rotation (NEOX) form, or adjacent pairs
    (`interleaved`, llama.cpp's normal RoPE: the Q/K rows of a llama GGUF are in that order)."""

    def __init__(self, rope_dim: int, base: float, max_positions: int, interleaved: bool = False) -> None:
        self.rope_dim = rope_dim
        self.interleaved = interleaved
        inv_freq = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)  # (R/2,)
        angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, R/2)
        self.cos = xp.asarray(np.cos(angles).astype(np.float32))  # (P, R/2)
        self.sin = xp.asarray(np.sin(angles).astype(np.float32))  # (P, R/2)

    def angles(self, positions: Array) -> tuple[Array, Array]:
        """Cosines and sines for the given positions, shaped to broadcast over heads."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]  # (N, 1, R/2) x2

    def apply(self, x: Array, cos: Array, sin: Array) -> None:
        """Rotate the first rope_dim features of every head of x (N, H, Dh) in place."""
        half = self.rope_dim // 2
        if self.interleaved:
            x1 = x[:, :, 0 : self.rope_dim : 2]  # (N, H, R/2) view: pair members 2i
            x2 = x[:, :, 1 : self.rope_dim : 2]  # (N, H, R/2) view: pair members 2i+1
        else:
            x1 = x[:, :, :half]  # (N, H, R/2) view
            x2 = x[:, :, half : self.rope_dim]  # (N, H, R/2) view
        x1_old = x1.copy()  # (N, H, R/2)
        x1 *= cos
        x1 -= x2 * sin  # (N, H, R/2)
        x2 *= cos
        x2 += x1_old * sin  # (N, H, R/2)


def swiglu(gate_up: Array) -> Array:
    """SiLU(gate) * up for a fused (N, 2F) gate/up projection (the compiled kernel for row-major float32 input,
    5x numpy's four passes at 32 rows: 0.64 against 3.3 ms for SmolLM2's 30 layers)."""
    if xp is np and gate_up.flags.c_contiguous and gate_up.dtype == np.float32:
        return kernels.swiglu(gate_up)  # (N, F)
    f = gate_up.shape[1] // 2
    gate = gate_up[:, :f]  # (N, F)
    out = xp.negative(gate)  # (N, F)
    xp.exp(out, out=out)
    out += 1.0
    xp.divide(gate, out, out=out)  # SiLU(gate)
    out *= gate_up[:, f:]  # (N, F)
    return out


def gelu_tanh(x: Array) -> Array:
    """GELU, tanh approximation (as GGML's gelu)."""
    return 0.5 * x * (1.0 + xp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))  # (N, F)


def geglu(gate_up: Array) -> Array:
    """GELU(gate) * up for a fused (N, 2F) gate/up projection."""
    f = gate_up.shape[1] // 2
    return gelu_tanh(gate_up[:, :f]) * gate_up[:, f:]  # (N, F)


def softmax_inplace(scores: Array) -> Array:
    """Softmax over the last axis, computed in place."""
    scores -= scores.max(axis=-1, keepdims=True)  # (..., L)
    xp.exp(scores, out=scores)  # (..., L)
    scores /= scores.sum(axis=-1, keepdims=True)  # (..., L)
    return scores


def attend_causal(q: Array, keys: Array, values: Array, past: int, window: int = 0, key_start: int = 0) -> Array:
    """Causal GQA of T new (pre-scaled) queries at positions past.. over keys at positions key_start..past+T-1.

    window > 0 limits each query to its last `window` positions (itself included).
    """
    t, n_heads, head_dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    length = keys.shape[1]
    qg = q.reshape(t, n_kv, group, head_dim).transpose(1, 2, 0, 3)  # (Hkv, G, T, Dh)
    scores = xp.matmul(qg, keys[:, None].transpose(0, 1, 3, 2))  # (Hkv, G, T, L)
    query_pos = past + xp.arange(t)  # (T,)
    key_pos = key_start + xp.arange(length)  # (L,)
    hidden = key_pos[None, :] > query_pos[:, None]  # (T, L)
    if window > 0:
        hidden |= key_pos[None, :] <= query_pos[:, None] - window  # (T, L)
    scores[:, :, hidden] = -xp.inf
    probs = softmax_inplace(scores)  # (Hkv, G, T, L)
    out = xp.matmul(probs, values[:, None])  # (Hkv, G, T, Dh)
    return out.transpose(2, 0, 1, 3).reshape(t, n_heads * head_dim)  # (T, H*Dh)


def paged_attend_decode(q: Array, keys: Array, values: Array, tables: Array, lengths: Array,
                        first_positions: Array) -> Array:
    """Decode attention of q (B, H, Dh) over each row's positions [first, length) of a paged arena (B, H*Dh).

    keys/values are one layer's blocks (Hkv, NB, BS, Dh), read in place through tables (B, nb): the compiled
    kernel makes no padded copy. `attend_decode` below is the same computation on gathered arrays.
    """
    return kernels.paged_attend_decode(q, keys, values, tables, lengths, first_positions)  # (B, H*Dh)


def attend_decode(q: Array, keys: Array, values: Array, mask: Array) -> Array:
    """One (pre-scaled) query per sequence over its padded keys: q (B, H, Dh), keys/values (Hkv, B, L, Dh).

    `mask` (B, L) is additive: 0 where a key is visible, -inf past the sequence's length (or outside its window).
    """
    b, n_heads, head_dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    qg = q.reshape(b, n_kv, group, head_dim).transpose(1, 0, 2, 3)  # (Hkv, B, G, Dh)
    scores = xp.matmul(qg, keys.transpose(0, 1, 3, 2))  # (Hkv, B, G, L)
    scores += mask[None, :, None, :]  # (Hkv, B, G, L)
    probs = softmax_inplace(scores)  # (Hkv, B, G, L)
    out = xp.matmul(probs, values)  # (Hkv, B, G, Dh)
    return out.transpose(1, 0, 2, 3).reshape(b, n_heads * head_dim)  # (B, H*Dh)
