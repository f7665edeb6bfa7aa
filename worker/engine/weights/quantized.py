"""Quantized projections kept only in a quantized form: no float32 copy of a quantized tensor.

A step of a few sequences reads every weight once and does little arithmetic with it, so its speed is the bytes
read. The forms:
- Q4_K, Q5_K and Q6_K (what Q4_K_M and Q5_K_M files are made of) keep the file's bits with sixteen rows
  interleaved (interleaved_k_blocks.py: 0.59, 0.72 and 0.83 bytes a weight), multiplied through
  interleaved_k_matmul.py, in integers against int8 activations;
- Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (blocks of 32 weights) become codes with float32 tables, sixteen rows
  interleaved (interleaved_blocks.py: half a byte a code where they fit in four bits), multiplied through
  interleaved_matmul.py, also in integers (against activations carried as two int8 bytes);
- MXFP4 (gpt-oss's experts) keeps the file's bytes with sixteen rows interleaved (interleaved_mxfp4.py: 0.53 bytes
  a weight), multiplied through mxfp4_matmul.py, in integers through a table of its values;
- a fused projection whose parts mix kinds of their own forms (a Q4_K query with a Q6_K value) keeps each part's.
Every kernel sums in one fixed order, so that a row's result never depends on the rest of its step.

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

from worker.engine.weights.interleaved_blocks import InterleavedBlocks, interleave
from worker.engine.weights.interleaved_k_blocks import InterleavedK, interleave_k
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4, interleave_mxfp4
from worker.engine.weights.k_blocks import KBlocks
from worker.engine.weights.mxfp4_blocks import MXFP4Blocks
from worker.engine.weights.quant_blocks import LEGACY_BLOCK, BlockCodes


@dataclass(frozen=True)
class StackedBlocks:
    """Row blocks of different forms stacked into one (sum out, in) projection (a Q4_K query and key beside a Q6_K
    value): each part keeps its own form and kernel, and the outputs are joined."""

    parts: tuple[BlockCodes | KBlocks | MXFP4Blocks | InterleavedBlocks | InterleavedK | InterleavedMXFP4, ...]

    @property
    def shape(self) -> tuple[int, int]:
        """(sum out, in)."""
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of every part."""
        return sum(p.nbytes for p in self.parts)

    def dequantize(self) -> np.ndarray:
        """The float32 matrix: (sum out, in)."""
        return np.concatenate([p.dequantize() for p in self.parts], axis=0)  # (sum out, in)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Some rows dequantized to float32: (N, in)."""
        return self.dequantize()[index]  # (N, in) (a projection: never an embedding table)


# a quantized matrix in one of the engine's forms (KBlocks and MXFP4Blocks only until it is held: quantized._held
# interleaves them)
Blocks = BlockCodes | KBlocks | MXFP4Blocks | InterleavedBlocks | InterleavedK | InterleavedMXFP4 | StackedBlocks


@dataclass(frozen=True)
class QuantizedLinear:
    """An (out, in) projection as block codes, whose input is x * column_scale (a folded norm weight) when set."""

    blocks: Blocks  # K-quant form, interleaved 32-weight blocks, block codes (out, in) with tables, or parts
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
        return self.blocks.rows(index)  # (N, in)


@dataclass(frozen=True, eq=False)
class PendingLinear:
    """A quantized projection not built yet: its key, shape, group and how to build its codes."""

    key: str  # names the recipe: file tensor and transforms (the repack cache's entry name)
    shape: tuple[int, int]  # (out, in)
    group: int
    build: Callable[[], Blocks]  # decodes and transforms; nothing is kept between calls
    column_scale: np.ndarray | None = None  # (in,)
    kind: str = ""  # the file's type ("Q4_K"; "" for a fusion of several)

    def permute_rows(self, order: np.ndarray) -> PendingLinear:
        """Rows reordered by the index array `order` (out,)."""
        tag = hashlib.sha256(np.ascontiguousarray(order, np.int64).tobytes()).hexdigest()[:12]
        parent = self.build

        def build() -> Blocks:
            return parent().take_rows(order)

        return replace(self, key=f"{self.key}|rows:{tag}", build=build)

    def scale_rows(self, factor: np.float32) -> PendingLinear:
        """Every output row multiplied by one factor (a query scale folded in)."""
        parent = self.build

        def build() -> Blocks:
            return parent().scaled(factor)

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

    def build() -> Blocks:
        built = [p.build() for p in parts]
        if any(isinstance(b, (KBlocks, MXFP4Blocks)) for b in built):  # forms of their own: runs of a kind stack
            runs = _merged_runs(built)  # type: ignore[arg-type]
            return runs[0] if len(runs) == 1 else StackedBlocks(tuple(runs))
        regrouped = [_regroup(b, group) for b in built]  # type: ignore[arg-type]
        return BlockCodes(
            codes=np.concatenate([b.codes for b in regrouped], axis=0),  # (sum out, in)
            scale=np.concatenate([b.scale for b in regrouped], axis=0),  # (sum out, in/G)
            offset=np.concatenate([b.offset for b in regrouped], axis=0),  # (sum out, in/G)
            group=group)

    out_dim = sum(p.shape[0] for p in parts)
    key = "cat(" + ",".join(p.key for p in parts) + f")/{group}"
    kind = parts[0].kind if all(p.kind == parts[0].kind for p in parts) else ""
    return PendingLinear(key, (out_dim, parts[0].shape[1]), group, build, scales[0], kind)


def _merged_runs(parts: list[BlockCodes | KBlocks | MXFP4Blocks]) -> list[BlockCodes | KBlocks | MXFP4Blocks]:
    """Adjacent K-quant parts of one kind, or MXFP4 parts, stacked into one (q and k of Q4_K stay one matrix beside
    v)."""
    runs: list[BlockCodes | KBlocks | MXFP4Blocks] = []
    for part in parts:
        last = runs[-1] if runs else None
        if isinstance(last, (KBlocks, MXFP4Blocks)) and type(part) is type(last) and part.kind == last.kind:
            runs[-1] = last.stacked([part])  # type: ignore[list-item]
        else:
            runs.append(part)
    return runs


BlockSource = Callable[[list[PendingLinear]], dict[str, Blocks]]  # codes by key (built or mapped)


def _walk(node: Any, visit: Callable[[Any], Any], kind: type = PendingLinear) -> Any:
    """node with every `kind` (a PendingLinear) inside (dataclasses, tuples, lists) replaced by visit(it); unchanged
    parts are the same objects."""
    if isinstance(node, kind):
        return visit(node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changed = {}
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            new = _walk(value, visit, kind)
            if new is not value:
                changed[f.name] = new
        return replace(node, **changed) if changed else node
    if isinstance(node, (tuple, list)):
        items = [_walk(item, visit, kind) for item in node]
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


def held_matrices(weights: Any) -> list[Blocks]:
    """Every matrix the materialized weights hold, a stacked projection's parts one by one (what the load warms
    kernels for)."""
    found: list[Blocks] = []

    def collect(linear: QuantizedLinear) -> QuantizedLinear:
        found.extend(linear.blocks.parts if isinstance(linear.blocks, StackedBlocks) else [linear.blocks])
        return linear

    _walk(weights, collect, QuantizedLinear)
    return found


def build_codes(pending: PendingLinear) -> Blocks:
    """A pending projection's arrays built in memory: K-quant super-blocks, MXFP4 blocks and block codes of 32 columns
    interleaved sixteen rows at a time (interleaved_k_blocks.py, interleaved_mxfp4.py, interleaved_blocks.py)."""
    return _held(pending.build())


def _held(b: Blocks) -> Blocks:
    """A built matrix in the form the kernels take, part by part."""
    if isinstance(b, KBlocks):
        return interleave_k(b)
    if isinstance(b, MXFP4Blocks):
        return interleave_mxfp4(b)
    if isinstance(b, (InterleavedBlocks, InterleavedK, InterleavedMXFP4)):
        return b
    if isinstance(b, StackedBlocks):
        return StackedBlocks(tuple(_held(part) for part in b.parts))  # type: ignore[misc]
    if b.group == LEGACY_BLOCK:
        return interleave(b)
    return BlockCodes(np.ascontiguousarray(b.codes, np.uint8), np.ascontiguousarray(b.scale, np.float32),
                      np.ascontiguousarray(b.offset, np.float32), b.group)


def build_in_memory(pendings: list[PendingLinear]) -> dict[str, Blocks]:
    """Every pending projection's codes built in memory, once per key (the source when no cache is used)."""
    built: dict[str, Blocks] = {}
    for pending in pendings:
        if pending.key not in built:
            built[pending.key] = build_codes(pending)
    return built
