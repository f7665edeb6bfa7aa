"""Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 matrices (blocks of 32 weights) with sixteen rows interleaved, the form
interleaved_matmul.py multiplies with: built once at load (and kept in the repack cache), so that no step
transposes anything and one 512-bit load holds four columns of sixteen rows.

Layout, for row group g (rows 16g .. 16g + 15; the last group padded with zero rows) and block b (columns
32b .. 32b + 31), codes[g, b, v] is 64 bytes whose bytes 4r .. 4r + 3 belong to row 16g + r:
- four-bit codes (every code below 16: Q4_0, Q4_1), v < 4: the low nibble of byte 4r + j is column 32b + 8v + j,
  the high nibble column 32b + 8v + 4 + j (half a byte a weight);
- otherwise one byte a code (Q5_0 and Q5_1: 0..31; Q8_0: its signed code + 128), v < 8: column 32b + 4v + j.
scale[g, b, r] is the block's float32 scale. A weight is scale * (code - zero) for one integer `zero` of the whole
matrix (8 for Q4_0, 16 for Q5_0, 128 for Q8_0); where the file's offsets are not that (Q4_1 and Q5_1's mins, a
fused projection mixing kinds), zero is 0 and offset[g, b, r] holds them: scale * code + offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.weights.quant_blocks import LEGACY_BLOCK, BlockCodes
from worker.engine.weights.read_only import freeze_arrays

TILE_ROWS = 16  # weight rows interleaved in a group
VECTOR_BYTES = 64  # bytes of one code vector: four codes (or eight nibbles) of each of the sixteen rows
ZEROS = (8, 16, 128)  # the integer zero points of Q4_0, Q5_0 and Q8_0 (codes - zero, times the scale)


@dataclass(frozen=True)
class InterleavedBlocks:
    """A (out, in) matrix of 32-weight blocks in the module docstring's layout."""

    codes: np.ndarray  # (G, B, 4 or 8, 64) uint8
    scale: np.ndarray  # (G, B, 16) float32
    offset: np.ndarray | None  # (G, B, 16) float32 when the offsets are not -zero * scale, else None
    zero: int  # subtracted from every code (0 when `offset` is set)
    out: int  # rows of the matrix (16 G, less the last group's padding)

    def __post_init__(self) -> None:
        freeze_arrays(self, self.arrays())

    @property
    def nibbles(self) -> bool:
        """Whether the codes are four bits, two a byte."""
        return self.codes.shape[2] == 4

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the matrix."""
        return self.out, self.codes.shape[1] * LEGACY_BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes of every array."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays this matrix has, by name."""
        arrays = {"codes": self.codes, "scale": self.scale}
        if self.offset is not None:
            arrays["offset"] = self.offset
        return arrays

    def row_table(self, table: np.ndarray, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows of a (G, B, 16) table, in row order: (N, B) (every row's when index is the whole slice)."""
        if isinstance(index, slice):
            groups, blocks, _ = table.shape
            return table.transpose(0, 2, 1).reshape(groups * TILE_ROWS, blocks)[: self.out][index]  # (N, B)
        rows = np.asarray(index)  # (N,)
        return table[rows // TILE_ROWS, :, rows % TILE_ROWS]  # (N, B): only those rows are read

    def code_rows(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' codes, one a byte: (N, in) uint8."""
        rows = np.arange(self.out)[index] if isinstance(index, slice) else np.asarray(index)  # (N,)
        groups, blocks, vectors, _ = self.codes.shape
        lanes = self.codes.reshape(groups, blocks, vectors, TILE_ROWS, 4)  # (G, B, V, 16, 4)
        picked = lanes[rows // TILE_ROWS, :, :, rows % TILE_ROWS]  # (N, B, V, 4)
        if self.nibbles:
            picked = np.stack([picked & 0x0F, picked >> 4], axis=3)  # (N, B, 4, 2, 4): columns 8v + 4h + j
        return np.ascontiguousarray(picked.reshape(len(rows), blocks * LEGACY_BLOCK))  # (N, in)

    def rows(self, index: np.ndarray | slice) -> np.ndarray:
        """Some rows dequantized to float32 (an embedding lookup reads only those rows): (N, in)."""
        codes = self.code_rows(index)  # (N, in) uint8
        n, cols = codes.shape
        grouped = codes.reshape(n, cols // LEGACY_BLOCK, LEGACY_BLOCK).astype(np.float32)  # (N, B, 32)
        if self.zero:
            grouped -= np.float32(self.zero)
        grouped *= self.row_table(self.scale, index)[:, :, None]
        if self.offset is not None:
            grouped += self.row_table(self.offset, index)[:, :, None]
        return grouped.reshape(n, cols)  # (N, in)

    def dequantize(self) -> np.ndarray:
        """The float32 matrix: (out, in)."""
        return self.rows(slice(None))  # (out, in)


def integer_zero(blocks: BlockCodes) -> int | None:
    """The integer zero point z with offset == -z * scale in every group (Q4_0, Q5_0, Q8_0), else None."""
    for zero in ZEROS:
        if np.array_equal(blocks.offset, -np.float32(zero) * blocks.scale):
            return zero
    return None


def interleave(blocks: BlockCodes) -> InterleavedBlocks:
    """Block codes of groups of 32 columns in the interleaved form."""
    if blocks.group != LEGACY_BLOCK:
        raise ValueError(f"interleaved blocks need groups of {LEGACY_BLOCK} columns, not {blocks.group}")
    codes = blocks.code_rows()  # (R, C) uint8
    rows, cols = codes.shape
    groups, count = -(-rows // TILE_ROWS), cols // LEGACY_BLOCK
    padding = groups * TILE_ROWS - rows
    zero = integer_zero(blocks)
    codes = np.pad(codes, ((0, padding), (0, 0)))  # (16 G, C)
    nibbles = codes.size > 0 and int(codes.max()) < 16
    if nibbles:
        split = codes.reshape(groups, TILE_ROWS, count, 4, 2, 4)  # (G, 16, B, v, half, j)
        packed = split[:, :, :, :, 0] | (split[:, :, :, :, 1] << 4)  # (G, 16, B, 4, 4)
    else:
        packed = codes.reshape(groups, TILE_ROWS, count, 8, 4)  # (G, 16, B, 8, 4)
    vectors = packed.shape[3]
    laid = packed.transpose(0, 2, 3, 1, 4).reshape(groups, count, vectors, VECTOR_BYTES)  # (G, B, V, 64)

    def table(values: np.ndarray) -> np.ndarray:
        padded = np.pad(values.astype(np.float32), ((0, padding), (0, 0)))  # (16 G, B)
        return np.ascontiguousarray(padded.reshape(groups, TILE_ROWS, count).transpose(0, 2, 1))  # (G, B, 16)

    return InterleavedBlocks(np.ascontiguousarray(laid, np.uint8), table(blocks.scale),
                             None if zero is not None else table(blocks.offset), zero or 0, rows)
