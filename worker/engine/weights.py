"""The float32 weights of a pre-norm decoder-only transformer, laid out for batched matmuls."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LayerWeights:
    """One transformer block; every matrix is (out, in), C-contiguous, so y = x @ W.T.

    The RMSNorm weights are folded into the columns of the matmul that follows each norm, and the
    attention scale 1/sqrt(Dh) into the query rows (and bias), so the forward pass skips those multiplies.
    """

    wqkv: np.ndarray  # (H*Dh + 2*Hkv*Dh, D) fused query/key/value projection, attn_norm folded in
    bqkv: np.ndarray | None  # (H*Dh + 2*Hkv*Dh,) or None
    wo: np.ndarray  # (D, H*Dh)
    w_gate_up: np.ndarray  # (2F, D) fused gate/up projection, ffn_norm folded in
    w_down: np.ndarray  # (D, F)

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays in the block."""
        arrays = [self.wqkv, self.wo, self.w_gate_up, self.w_down]
        return sum(a.nbytes for a in arrays) + (0 if self.bqkv is None else self.bqkv.nbytes)


@dataclass(frozen=True)
class TransformerWeights:
    """All weights of the model; `output` may be the same array as `token_embedding` (tied)."""

    token_embedding: np.ndarray  # (V, D)
    layers: tuple[LayerWeights, ...]
    output_norm: np.ndarray  # (D,)
    output: np.ndarray  # (V, D)

    @property
    def nbytes(self) -> int:
        """Bytes of all distinct arrays."""
        total = self.token_embedding.nbytes + self.output_norm.nbytes + sum(layer.nbytes for layer in self.layers)
        return total + (0 if self.output is self.token_embedding else self.output.nbytes)
