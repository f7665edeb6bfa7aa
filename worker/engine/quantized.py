"""Quantized projections kept only as the file's 8-bit block codes: no float32 copy of a quantized tensor.

A step of a few sequences reads every weight once and does little arithmetic with it, so its speed is the bytes
read: the block form (1 byte per weight plus per-group tables) reads a quarter of float32's, and codes that fit in
four bits (Q4_0, Q4_1, Q4_K) are held packed two a byte (0.75 bytes a weight with their tables), multiplied by
nibble_kernels.py. Steps of every width multiply through block_kernels.py or nibble_kernels.py (wide ones decode a
tile of weight rows at a time), in one canonical summation order, so that a row's result never depends on the
rest of the step.

Loading is two-phase. The architecture's loader gets each quantized tensor as a `PendingLinear`: a recipe (the
file tensor, then row permutations, row scales, fusing) with a key that names it, and nothing decoded. Row
transforms and fusing compose recipes; a folded norm weight becomes a per-column scale of x (it cannot be
merged into per-group codes). `materialize` then turns every pending projection of the loaded weights into a
`QuantizedLinear` whose arrays are built once, or taken from the repack cache by key (repack_cache.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from worker.engine.quant_blocks import BlockCodes, pack_nibbles


@dataclass(frozen=True)
class QuantizedLinear:
    """An (out, in) projection as block codes, whose input is x * column_scale (a folded norm weight) when set."""

    blocks: BlockCodes  # (out, in) codes or (out, in/2) packed ones, (out, in/G) tables
    column_scale: np.ndarray | None = None  # (in,) folded norm weight the codes' input is scaled by

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in)."""
        return self.blocks.shape

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and tables."""
        return self.blocks.nbytes

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Some rows dequantized to float32 (an embedding lookup): (N, in); the column scale is not applied."""
        b = self.blocks
        codes = b.code_rows(index)  # (N, in) uint8
        n, cols = codes.shape
        grouped = codes.reshape(n, cols // b.group, b.group).astype(np.float32)  # (N, in/G, G)
        grouped *= b.scale[index][:, :, None]
        grouped += b.offset[index][:, :, None]
        return grouped.reshape(n, cols)  # (N, in)


@dataclass(frozen=True, eq=False)
class PendingLinear:
    """A quantized projection not built yet: its key, shape, group and how to build its codes."""

    key: str  # names the recipe: file tensor and transforms (the repack cache's entry name)
    shape: tuple[int, int]  # (out, in)
    group: int
    build: Callable[[], BlockCodes]  # decodes and transforms; nothing is kept between calls
    column_scale: np.ndarray | None = None  # (in,)

    def permute_rows(self, order: np.ndarray) -> PendingLinear:
        """Rows reordered by the index array `order` (out,)."""
        tag = hashlib.sha256(np.ascontiguousarray(order, np.int64).tobytes()).hexdigest()[:12]
        parent = self.build

        def build() -> BlockCodes:
            b = parent()
            return BlockCodes(np.ascontiguousarray(b.codes[order]), np.ascontiguousarray(b.scale[order]),
                              np.ascontiguousarray(b.offset[order]), b.group)

        return replace(self, key=f"{self.key}|rows:{tag}", build=build)

    def scale_rows(self, factor: np.float32) -> PendingLinear:
        """Every output row multiplied by one factor (a query scale folded in)."""
        parent = self.build

        def build() -> BlockCodes:
            b = parent()
            return replace(b, scale=b.scale * np.float32(factor), offset=b.offset * np.float32(factor))

        return replace(self, key=f"{self.key}|scale:{float(factor)!r}", build=build)

    def fold_columns(self, norm_weight: np.ndarray) -> PendingLinear:
        """A norm's per-feature weight folded into the input columns: a per-column scale of x."""
        column_scale = norm_weight if self.column_scale is None else self.column_scale * norm_weight  # (in,)
        return replace(self, column_scale=np.ascontiguousarray(column_scale, dtype=np.float32))

    def dequantize(self) -> np.ndarray:
        """The float32 matrix (out, in), column scale applied (for small tables and the float32 fallback)."""
        dense = self.build().dequantize()  # (out, in)
        return dense if self.column_scale is None else dense * self.column_scale[None, :]  # (out, in)


def _regroup(blocks: BlockCodes, group: int) -> BlockCodes:
    """The same codes with per-group tables repeated for a smaller group size."""
    if blocks.group == group:
        return blocks
    factor = blocks.group // group
    return replace(blocks, scale=np.repeat(blocks.scale, factor, axis=1), offset=np.repeat(blocks.offset, factor, axis=1),
                   group=group)


def fuse_pending_rows(parts: tuple[PendingLinear, ...]) -> PendingLinear | None:
    """Projections sharing an input stacked into one (sum out_i, in); None when their column scales differ."""
    scales = [p.column_scale for p in parts]
    if any(s is not None for s in scales) and not all(s is not None and np.array_equal(s, scales[0]) for s in scales):
        return None
    group = min(p.group for p in parts)
    if any(p.group % group for p in parts):
        return None

    def build() -> BlockCodes:
        regrouped = [_regroup(p.build(), group) for p in parts]
        return BlockCodes(
            codes=np.concatenate([b.codes for b in regrouped], axis=0),  # (sum out, in)
            scale=np.concatenate([b.scale for b in regrouped], axis=0),  # (sum out, in/G)
            offset=np.concatenate([b.offset for b in regrouped], axis=0),  # (sum out, in/G)
            group=group)

    out_dim = sum(p.shape[0] for p in parts)
    key = "cat(" + ",".join(p.key for p in parts) + f")/{group}"
    return PendingLinear(key, (out_dim, parts[0].shape[1]), group, build, scales[0])


BlockSource = Callable[[list[PendingLinear]], dict[str, BlockCodes]]  # codes by key (built or mapped)


def _walk(node: Any, visit: Callable[[PendingLinear], Any]) -> Any:
    """node with every PendingLinear inside (dataclasses, tuples, lists) replaced by visit(pending); unchanged
    parts are the same objects."""
    if isinstance(node, PendingLinear):
        return visit(node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changed = {}
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            new = _walk(value, visit)
            if new is not value:
                changed[f.name] = new
        return replace(node, **changed) if changed else node
    if isinstance(node, (tuple, list)):
        items = [_walk(item, visit) for item in node]
        if any(a is not b for a, b in zip(items, node)):
            return type(node)(items)
    return node


def materialize(weights: Any, source: BlockSource) -> Any:
    """The weights with every PendingLinear replaced by a QuantizedLinear whose codes `source` gives by key (one
    object per pending object, so a tied output stays the embedding)."""
    pendings: list[PendingLinear] = []
    _walk(weights, pendings.append)
    blocks = source(pendings)
    by_object: dict[int, QuantizedLinear] = {}

    def convert(pending: PendingLinear) -> QuantizedLinear:
        if id(pending) not in by_object:
            by_object[id(pending)] = QuantizedLinear(blocks[pending.key], pending.column_scale)
        return by_object[id(pending)]

    return _walk(weights, convert)


def build_codes(pending: PendingLinear) -> BlockCodes:
    """A pending projection's codes built in memory, row-major; packed two a byte when every code fits in four
    bits (quant_blocks.pack_nibbles)."""
    b = pending.build()
    codes = pack_nibbles(b.codes) if b.packable() else np.ascontiguousarray(b.codes, np.uint8)
    return BlockCodes(codes, np.ascontiguousarray(b.scale, np.float32), np.ascontiguousarray(b.offset, np.float32),
                      b.group, packed=b.packable())


def build_in_memory(pendings: list[PendingLinear]) -> dict[str, BlockCodes]:
    """Every pending projection's codes built in memory, once per key (the source when no cache is used)."""
    built: dict[str, BlockCodes] = {}
    for pending in pendings:
        if pending.key not in built:
            built[pending.key] = build_codes(pending)
    return built
