"""RoPE frequencies as llama.cpp computes them: the base, linear or YaRN context scaling, and per-dimension
frequency factors (Llama 3's `rope_freqs.weight`).

ggml's rope (ggml-cpu/ops.cpp, rope_yarn) rotates pair i of a head at position p by
    theta_extrap = p * base^(-2i/R) / freq_factor[i]
    theta        = freq_scale * theta_extrap                      (linear: freq_scale = 1 / factor)
    YaRN:  theta = theta * (1 - ramp_i) + theta_extrap * ramp_i,  magnitude * (1 + 0.1 ln(1 / freq_scale))
and scales cos and sin by the attention factor. The metadata rules (a missing scaling type means "linear"; the factor
from rope.scaling.factor or the old rope.scale_linear; YaRN's beta_fast 32 and beta_slow 1) are llama.cpp's
llama-model.cpp and llama-context.cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.engine.errors import ModelLoadError

SCALING_TYPES = ("none", "linear", "yarn")  # what the engine computes; longrope and others are refused by name
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # llama.cpp's hparams defaults: its loaders read no file key for them


@dataclass(frozen=True)
class RopeScaling:
    """How a file scales its rotary frequencies (llama.cpp's rope_scaling_type, rope_freq_scale, n_ctx_orig_yarn)."""

    kind: str = "none"  # none | linear | yarn
    factor: float = 1.0  # context extension factor; freq_scale = 1 / factor
    original_context: int = 0  # YaRN's n_ctx_orig (the training context when the file names none)
    attn_factor: float = 1.0  # rope.scaling.attn_factor: cos and sin scaled by it

    @property
    def freq_scale(self) -> float:
        """The multiplier of every angle (1 when the kind is none, as llama.cpp forces)."""
        return 1.0 if self.kind == "none" or self.factor == 0.0 else 1.0 / self.factor

    @property
    def ext_factor(self) -> float:
        """YaRN's extrapolation mix: 1 for yarn, 0 otherwise (llama.cpp's default when the context sets none)."""
        return 1.0 if self.kind == "yarn" else 0.0

    @property
    def magnitude(self) -> float:
        """The factor on cos and sin: attn_factor, and YaRN's 1 + 0.1 ln(factor) (net of llama.cpp's cancelling)."""
        scale = float(np.float32(self.attn_factor))
        if self.ext_factor != 0.0 and self.factor > 1.0:  # get_mscale / its cancelling / rope_yarn's own factor
            scale *= 1.0 + 0.1 * math.log(self.factor)
        return scale


def rope_scaling_from_metadata(metadata: dict[str, Any], arch: str, context_length: int, path: str) -> RopeScaling:
    """The file's RoPE scaling, or ModelLoadError naming a type the engine does not compute."""
    kind = str(metadata.get(f"{arch}.rope.scaling.type", "linear"))
    if kind not in SCALING_TYPES:
        raise ModelLoadError(path, f"metadata {arch}.rope.scaling.type = {kind!r}: RoPE scaling of this type is not "
                                   f"supported (supported: {', '.join(SCALING_TYPES)})")
    factor = float(metadata.get(f"{arch}.rope.scaling.factor", metadata.get(f"{arch}.rope.scale_linear", 0.0)) or 0.0)
    if factor < 0 or not math.isfinite(factor):
        raise ModelLoadError(path, f"metadata {arch}.rope.scaling.factor = {factor} is not a positive number")
    original = int(metadata.get(f"{arch}.rope.scaling.original_context_length", context_length) or context_length)
    attn_factor = float(metadata.get(f"{arch}.rope.scaling.attn_factor", 1.0))
    return RopeScaling(kind=kind, factor=factor or 1.0, original_context=original, attn_factor=attn_factor)


def _yarn_corr_dims(rope_dim: int, original_context: int, base: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the first and last pair index of YaRN's ramp, in float32 as ggml computes them."""
    def corr_dim(n_rot: float) -> float:
        return float(np.float32(rope_dim * math.log(original_context / (n_rot * 2 * math.pi)) / (2 * math.log(base))))
    start = max(0.0, math.floor(corr_dim(YARN_BETA_FAST)))
    end = min(rope_dim - 1.0, math.ceil(corr_dim(YARN_BETA_SLOW)))
    return start, end


def rotary_cos_sin(rope_dim: int, base: float, max_positions: int, scaling: RopeScaling | None = None,
                   freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Cosine and sine tables (P, R/2) float32 for positions 0..P-1, in float64 before the one rounding."""
    scaling = scaling or RopeScaling()
    pairs = np.arange(0, rope_dim, 2, dtype=np.float64)  # (R/2,) i0 = 2i
    inv_freq = base ** (-pairs / rope_dim)  # (R/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, np.float64)[: rope_dim // 2]  # (R/2,)
    extrap = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, R/2)
    angles = extrap * scaling.freq_scale  # (P, R/2)
    if scaling.ext_factor != 0.0:
        low, high = _yarn_corr_dims(rope_dim, scaling.original_context, base)
        y = (pairs / 2 - low) / max(0.001, high - low)  # (R/2,) rope_yarn_ramp's argument (i0 / 2)
        ramp = (1.0 - np.clip(y, 0.0, 1.0)) * scaling.ext_factor  # (R/2,)
        angles = angles * (1.0 - ramp) + extrap * ramp  # (P, R/2)
    magnitude = scaling.magnitude
    return ((np.cos(angles) * magnitude).astype(np.float32),  # (P, R/2)
            (np.sin(angles) * magnitude).astype(np.float32))  # (P, R/2)
