"""What an architecture tells the LoRA loader: its adapter-targetable projections and their load transforms."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoraPart:
    """One base tensor inside a fused projection: its GGUF name, shape and the row transforms it got."""

    tensor: str  # e.g. "attn_q" (the GGUF name is blk.{i}.{tensor}.weight)
    out_dim: int
    in_dim: int
    unpermute_heads: int = 0  # > 0: llama.cpp's Q/K row permutation is undone with this many heads
    out_scale: float = 1.0  # a scale folded into the base rows (the query scale)


@dataclass(frozen=True)
class LoraTarget:
    """One base projection as the engine calls it, its parts in row order, and the norm folded into its input."""

    projection: str  # "qkv", "o", "gate_up", "down": the name blocks pass to ForwardBatch.adapt
    parts: tuple[LoraPart, ...]
    input_norm: str | None = None  # base tensor (blk.{i}.{input_norm}.weight) folded into the columns
