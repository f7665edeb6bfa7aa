"""The forward pass's array operations as the architectures call them: matmuls over every weight form, norms,
RoPE, activations, attention (each on numpy or on a compiled kernel of kernels/).

Model and architecture code call only these functions (plus array methods such as reshape), so a second
array backend (CuPy on a GPU) replaces `xp` and this module, not the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.engine.experts import Routing, StackedExperts, expert_rows
from worker.engine.formats.rope_scaling import RopeScaling, rotary_cos_sin
from worker.engine.kernels import (
    float_matmul,
    interleaved_k_matmul,
    interleaved_matmul,
    k_activations,
    layer_kernels,
    mxfp4_matmul,
    paged_attention,
)
from worker.engine.weights.interleaved_blocks import InterleavedBlocks
from worker.engine.weights.interleaved_k_blocks import InterleavedK
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4
from worker.engine.weights.quantized import Blocks, PendingLinear, QuantizedLinear, StackedBlocks

xp: Any = np  # the array module of the forward path
Array = Any  # an array of the backend in `xp`
Weight = Any  # a projection: an (out, in) float32 array, or a QuantizedLinear (block codes only)
_NARROW_ROWS = 64  # the widest step the scheduler fills with speculative drafts (narrow_rows)


def narrow_rows() -> int:
    """The widest step worth filling with speculative drafts (every step, of any width, runs the same kernels)."""
    return _NARROW_ROWS


def weight(matrix: Any) -> Weight:
    """A projection as the forward path takes it: quantized ones (built or pending) as they are, arrays
    row-major float32 on the backend (a C-contiguous float32 array is not copied)."""
    if isinstance(matrix, (QuantizedLinear, PendingLinear)):
        return matrix
    return xp.ascontiguousarray(xp.asarray(matrix, dtype=np.float32))


def dense(matrix: Any) -> Array:
    """The float32 (out, in) form of a small table (BERT's positions): quantized ones are dequantized whole."""
    if isinstance(matrix, PendingLinear):
        return matrix.dequantize()  # (out, in)
    if isinstance(matrix, QuantizedLinear):
        return matrix.rows(np.arange(matrix.shape[0]))  # (out, in)
    return matrix


def embedding_rows(table: Weight, tokens: Array) -> Array:
    """The rows of an embedding table for token ids (N,): (N, D), a new float32 array (only those rows are
    dequantized when the table is block-coded)."""
    if isinstance(table, QuantizedLinear):
        return table.rows(tokens)  # (N, D)
    return xp.asarray(table[tokens], dtype=np.float32)  # (N, D)


def _block_linear(x: Array, weight: QuantizedLinear) -> Array:
    """x @ weight.T through the weight's quantized form (integer kernels): (N, out), C-ordered."""
    if weight.column_scale is not None:
        x = x * weight.column_scale  # (N, in)
    return _quantized_matmul(x, weight.blocks)  # (N, out)


def _quantized_matmul(x: Array, blocks: Blocks) -> Array:
    """x (N, in) times a quantized matrix (out, in) transposed, by its form: (N, out), C-ordered."""
    if isinstance(blocks, StackedBlocks):
        return xp.concatenate([_quantized_matmul(x, part) for part in blocks.parts], axis=1)  # (N, out)
    if isinstance(blocks, InterleavedBlocks):
        return interleaved_matmul.interleaved_matmul(x, blocks)  # (N, out)
    if isinstance(blocks, InterleavedK):
        return interleaved_k_matmul.interleaved_k_matmul(x, blocks)  # (N, out)
    if isinstance(blocks, InterleavedMXFP4):
        return mxfp4_matmul.mxfp4_matmul(x, blocks)  # (N, out)
    return float_matmul.block_matmul(x, blocks.codes, blocks.scale, blocks.offset)  # (N, out)


def asarray(values: Any, dtype: Any = None) -> Array:
    """An array of the backend (token ids, positions, indices)."""
    return xp.asarray(values, dtype=dtype)


def empty(shape: tuple[int, ...], dtype: Any = np.float32) -> Array:
    """An uninitialised array of the backend."""
    return xp.empty(shape, dtype)


def linear(x: Array, weight: Weight) -> Array:
    """x @ weight.T for x (N, in) and weight (out, in): (N, out), C-ordered. Block codes and float32 matrices alike
    go through float_matmul' canonical reduction, so each output row depends on its own input row only (never
    on the step's width: no BLAS, whose summation order depends on the shape)."""
    if isinstance(weight, QuantizedLinear):
        return _block_linear(x, weight)  # (N, out)
    return float_matmul.float_matmul(x, weight)  # (N, out)


def encoder_linear(x: Array, weight: Weight) -> Array:
    """x @ weight.T for an encoder's whole texts (BERT): (weight @ x.T).T on OpenBLAS for float32 matrices, a
    column-major (N, out); an encoder keeps no cache, so it needs no batch invariance."""
    if isinstance(weight, QuantizedLinear):
        return _block_linear(x, weight)  # (N, out), C-ordered
    return (weight @ x.T).T  # (N, out), Fortran-ordered


def expert_linear(x: Array, experts: StackedExperts, routing: Routing, *, per_pair: bool = False) -> Array:
    """Each (token, expert) pair's row of x times its expert's matrix transposed: (P, rows), pairs grouped by expert.
    x is (N, in), a row per token (each token's row met by each of its experts), or (P, in) a row per pair. K-quant
    experts go through one launch for the whole step (each used expert's codes read once, for all of its rows);
    every form computes each pair's row alone, as `linear` does."""
    weight = experts.weight
    if isinstance(weight, QuantizedLinear) and isinstance(weight.blocks, (InterleavedK, InterleavedMXFP4)):
        if weight.column_scale is not None:
            x = x * weight.column_scale  # (N or P, in)
        k_quant = isinstance(weight.blocks, InterleavedK)
        rows = (k_activations.quantize_rows(x) if k_quant
                else interleaved_matmul.quantize_halves(x))  # quantized once per token, then gathered per pair
        if not per_pair:
            rows = type(rows)(*(np.ascontiguousarray(part[routing.pair_token]) for part in rows))
        grouped = interleaved_k_matmul.interleaved_k_grouped if k_quant else mxfp4_matmul.mxfp4_grouped
        return grouped(rows, weight.blocks, routing.experts, routing.starts, experts.rows)  # (P, rows)
    pairs = x if per_pair else x[routing.pair_token]  # (P, in)
    out = xp.empty((pairs.shape[0], experts.rows), np.float32)  # (P, rows)
    for i, expert in enumerate(routing.experts):
        first, last = int(routing.starts[i]), int(routing.starts[i + 1])
        out[first:last] = linear(xp.ascontiguousarray(pairs[first:last]), expert_rows(weight, int(expert), experts.rows))
    return out


def lora_delta(x: Array, a: Array, b: Array) -> Array:
    """A low-rank update (x @ a.T) @ b.T for x (G, in), a (R, in), b (out, R): (G, out), C-ordered, in the
    canonical reduction (each row independent of the others in the group)."""
    return float_matmul.float_matmul(float_matmul.float_matmul(x, a), b)  # (G, out)


def linear_rows(x: Array, weight: Weight) -> Array:
    """x @ weight.T with a row-major result (the output projection): (N, out), C-ordered."""
    return linear(x, weight)  # (N, out)


def contiguous(x: Array) -> Array:
    """A row-major copy (or x itself when it already is)."""
    return xp.ascontiguousarray(x)


def rms_normalize(x: Array, eps: float) -> Array:
    """Root-mean-square normalisation over the last axis (the norm's weight is folded into the next matmul)."""
    if xp is np and x.dtype == np.float32 and x.ndim == 2:
        return layer_kernels.rms_rows(x, eps)  # (N, D), compiled: one fixed order per row
    scale = xp.einsum("nd,nd->n", x, x)[:, None]  # (N, 1)
    scale *= 1.0 / x.shape[1]
    scale += eps
    xp.sqrt(scale, out=scale)
    return x / scale  # (N, D)


def rms_normalize_heads(x: Array, eps: float) -> Array:
    """RMS normalisation of every head vector of x (N, H, Dh) over Dh (QK-norm); a new array."""
    if xp is np and x.dtype == np.float32:
        return layer_kernels.rms_rows(x.reshape(-1, x.shape[2]), eps).reshape(x.shape)  # (N, H, Dh)
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
    """Cosine/sine tables for rotary position embeddings in half-rotation (NEOX) form, scaled as the file says
    (rope_scaling.py)."""

    def __init__(self, rope_dim: int, base: float, max_positions: int, scaling: RopeScaling | None = None,
                 freq_factors: np.ndarray | None = None) -> None:
        self.rope_dim = rope_dim
        cos, sin = rotary_cos_sin(rope_dim, base, max_positions, scaling, freq_factors)  # (P, R/2) x2
        self.cos = xp.asarray(cos)  # (P, R/2)
        self.sin = xp.asarray(sin)  # (P, R/2)

    def angles(self, positions: Array) -> tuple[Array, Array]:
        """Cosines and sines for the given positions, shaped to broadcast over heads."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]  # (N, 1, R/2) x2

    def apply(self, x: Array, cos: Array, sin: Array) -> None:
        """Rotate the first rope_dim features of every head of x (N, H, Dh) in place."""
        if xp is np and x.dtype == np.float32 and cos.dtype == np.float32:
            layer_kernels.rotate(x, cos, sin, self.rope_dim)  # the same arithmetic, compiled
            return
        half = self.rope_dim // 2
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
        return layer_kernels.swiglu(gate_up)  # (N, F)
    f = gate_up.shape[1] // 2
    gate = gate_up[:, :f]  # (N, F)
    out = xp.negative(gate)  # (N, F)
    xp.exp(out, out=out)
    out += 1.0
    xp.divide(gate, out, out=out)  # SiLU(gate)
    out *= gate_up[:, f:]  # (N, F)
    return out


def swiglu_clamped(gate_up: Array, alpha: float, limit: float) -> Array:
    """gpt-oss's SwiGLU (ggml's swiglu_oai) of a fused (N, 2F) gate/up: g = min(gate, limit), u = clip(up, -limit,
    limit), g * sigmoid(alpha * g) * (u + 1): (N, F), float32 element by element."""
    f = gate_up.shape[1] // 2
    gate = xp.minimum(gate_up[:, :f], np.float32(limit))  # (N, F)
    up = xp.clip(gate_up[:, f:], np.float32(-limit), np.float32(limit))  # (N, F)
    out = gate * np.float32(-alpha)  # (N, F)
    xp.exp(out, out=out)
    out += np.float32(1.0)
    xp.divide(gate, out, out=out)  # gate * sigmoid(alpha * gate)
    up += np.float32(1.0)
    out *= up
    return out  # (N, F)


def gelu_tanh(x: Array) -> Array:
    """GELU, tanh approximation (as GGML's gelu)."""
    return 0.5 * x * (1.0 + xp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))  # (N, F)


def gelu_tanh_inplace(x: Array) -> Array:
    """GELU (tanh form, as GGML's) computed in x's own memory with one scratch array: x (N, F) returned."""
    t = x * x  # (N, F)
    t *= 0.044715
    t += 1.0
    t *= x
    t *= 0.7978845608028654
    xp.tanh(t, out=t)
    t += 1.0
    t *= 0.5
    x *= t
    return x  # (N, F)


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


def paged_attend_decode(q: Array, keys: Array, values: Array, tables: Array, lengths: Array,
                        first_positions: Array, sinks: Array | None = None) -> Array:
    """Attention of q (B, H, Dh), one query a row, over each row's positions [first, length) of a paged arena:
    (B, H*Dh). Decode tokens and prompt rows alike (one computation per row, whatever the step holds).

    keys/values are one layer's blocks (NG, Hkv, G, BS, Dh), read in place through tables (B, nb): the compiled
    kernel makes no padded copy. `attend_decode` below is the same computation on gathered arrays. sinks (H,): a
    logit per head in each softmax's denominator only (gpt-oss's attention sinks), or None.
    """
    return paged_attention.paged_attend_decode(q, keys, values, tables, lengths, first_positions, sinks)  # (B, H*Dh)


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


def layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    """LayerNorm over the last axis with its weight and bias: a new (N, D) array."""
    mean = x.mean(axis=1, keepdims=True)  # (N, 1)
    centered = x - mean  # (N, D)
    var = xp.einsum("nd,nd->n", centered, centered)[:, None]  # (N, 1)
    var *= 1.0 / x.shape[1]
    var += eps
    xp.sqrt(var, out=var)
    centered /= var  # (N, D)
    centered *= weight
    centered += bias
    return centered  # (N, D)


ATTENTION_SCORE_BUDGET = 1 << 24  # floats of (B, H, T, T) scores one bidirectional attention call may hold (64 MiB)


def attend_bidirectional(q: Array, k: Array, v: Array, starts: Array) -> Array:
    """Full (non-causal) attention of every text over its own tokens only; q pre-scaled, q/k/v (N, H, Dh) ragged,
    text i owning rows starts[i]..starts[i+1]-1. Texts of similar length are padded to the longest of their group
    and the padding keys masked; groups keep the scores within ATTENTION_SCORE_BUDGET. Returns (N, H*Dh)."""
    n, n_heads, head_dim = q.shape
    out = xp.empty((n, n_heads * head_dim), dtype=q.dtype)  # (N, H*Dh)
    lengths = starts[1:] - starts[:-1]  # (B,)
    order = xp.argsort(lengths, kind="stable")  # (B,) shortest first: little padding in each group
    first = 0
    while first < len(order):
        last = first + 1
        while last < len(order):
            longest = int(lengths[order[last]])
            if (last + 1 - first) * n_heads * longest * longest > ATTENTION_SCORE_BUDGET:
                break
            last += 1
        group = order[first:last]  # (G,)
        _attend_group(q, k, v, starts[group], lengths[group], out)
        first = last
    return out  # (N, H*Dh)


def _attend_group(q: Array, k: Array, v: Array, firsts: Array, lengths: Array, out: Array) -> None:
    """Padded masked attention of G texts (text g in rows firsts[g]..firsts[g]+lengths[g]-1) written into out."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    longest = int(lengths.max())
    offsets = xp.arange(longest)  # (T,)
    valid = offsets[None, :] < lengths[:, None]  # (G, T)
    rows = xp.where(valid, firsts[:, None] + offsets[None, :], firsts[0])  # (G, T) row of each padded slot
    qp = xp.ascontiguousarray(q[rows].transpose(0, 2, 1, 3))  # (G, H, T, Dh)
    kp = xp.ascontiguousarray(k[rows].transpose(0, 2, 3, 1))  # (G, H, Dh, T)
    vp = xp.ascontiguousarray(v[rows].transpose(0, 2, 1, 3))  # (G, H, T, Dh)
    scores = xp.matmul(qp, kp)  # (G, H, T, T)
    if not bool(valid.all()):
        scores += xp.where(valid, 0.0, -xp.inf).astype(q.dtype)[:, None, None, :]  # (G, H, T, T) padding hidden
    probs = softmax_inplace(scores)  # (G, H, T, T)
    mixed = xp.matmul(probs, vp).transpose(0, 2, 1, 3).reshape(len(lengths), longest, n_heads * head_dim)  # (G, T, H*Dh)
    out[rows[valid]] = mixed[valid]  # (n, H*Dh)
