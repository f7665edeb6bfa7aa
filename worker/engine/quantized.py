"""A projection kept in two forms: float32 for batched matmuls, and the file's 8-bit block codes for decode.

A step of one or two sequences reads every weight once and does little arithmetic with it, so its speed is the
bytes read: the block form (1 byte per weight plus per-group tables) runs about 2.5 times faster there than
float32 through BLAS. Wider steps are arithmetic-bound and use the float32 form. Load-time transforms (row
permutation, scaling, fusing, folding a norm into the input columns) are applied to both forms alike; a folded
norm weight cannot be merged into per-group codes, so the block form keeps it as a per-column scale of x.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from worker.engine.quant_blocks import BlockCodes


@dataclass(frozen=True)
class QuantizedLinear:
    """An (out, in) projection: `dense` float32 (norm folded in) and `blocks`, whose input x * column_scale."""

    dense: np.ndarray  # (out, in) float32, C-contiguous
    blocks: BlockCodes  # (out, in) codes
    column_scale: np.ndarray | None = None  # (in,) folded norm weight the block form applies to x

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in), as the float32 matrix's."""
        return self.dense.shape

    @property
    def nbytes(self) -> int:
        """Bytes of both forms."""
        return self.dense.nbytes + self.blocks.nbytes

    def permute_rows(self, order: np.ndarray) -> QuantizedLinear:
        """Rows reordered by the index array `order` (out,), in both forms."""
        b = self.blocks
        return QuantizedLinear(np.ascontiguousarray(self.dense[order]), BlockCodes(
            np.ascontiguousarray(b.codes[order]), np.ascontiguousarray(b.scale[order]),
            np.ascontiguousarray(b.offset[order]), b.group), self.column_scale)

    def scale_rows(self, factor: np.float32) -> QuantizedLinear:
        """Every output row multiplied by one factor (a query scale folded in)."""
        b = self.blocks
        return replace(self, dense=self.dense * factor,
                       blocks=replace(b, scale=b.scale * factor, offset=b.offset * factor))

    def fold_columns(self, norm_weight: np.ndarray) -> QuantizedLinear:
        """A norm's per-feature weight folded into the input columns (a per-column scale of x for the blocks)."""
        column_scale = norm_weight if self.column_scale is None else self.column_scale * norm_weight  # (in,)
        dense = np.ascontiguousarray(self.dense * norm_weight[None, :], dtype=np.float32)  # (out, in)
        return replace(self, dense=dense, column_scale=np.ascontiguousarray(column_scale, dtype=np.float32))


def _regroup(blocks: BlockCodes, group: int) -> BlockCodes:
    """The same codes with per-group tables repeated for a smaller group size."""
    if blocks.group == group:
        return blocks
    factor = blocks.group // group
    return replace(blocks, scale=np.repeat(blocks.scale, factor, axis=1), offset=np.repeat(blocks.offset, factor, axis=1),
                   group=group)


def fuse_quantized_rows(parts: tuple[QuantizedLinear, ...]) -> QuantizedLinear | None:
    """Projections sharing an input stacked into one (sum out_i, in); None when their column scales differ."""
    scales = [p.column_scale for p in parts]
    if any(s is not None for s in scales) and not all(s is not None and np.array_equal(s, scales[0]) for s in scales):
        return None
    group = min(p.blocks.group for p in parts)
    if any(p.blocks.group % group for p in parts):
        return None
    regrouped = [_regroup(p.blocks, group) for p in parts]
    return QuantizedLinear(
        dense=np.ascontiguousarray(np.concatenate([p.dense for p in parts], axis=0), dtype=np.float32),  # (sum out, in)
        blocks=BlockCodes(
            codes=np.ascontiguousarray(np.concatenate([b.codes for b in regrouped], axis=0)),  # (sum out, in)
            scale=np.ascontiguousarray(np.concatenate([b.scale for b in regrouped], axis=0)),  # (sum out, in/G)
            offset=np.ascontiguousarray(np.concatenate([b.offset for b in regrouped], axis=0)),  # (sum out, in/G)
            group=group),
        column_scale=scales[0],
    )
