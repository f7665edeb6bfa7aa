"""MXFP4 matrices (mxfp4_blocks.py) with sixteen rows interleaved, the form mxfp4_matmul.py multiplies with: built
once at load (and kept in the repack cache) from the file's blocks, so that no step transposes anything and one
512-bit load holds four code bytes of sixteen rows.

The bytes are the file's, only interleaved: for row group g (rows 16g .. 16g + 15; the last group padded with zero
rows) and block b (columns 32b .. 32b + 31),
- codes[g, b, v] (v < 4): 64 bytes whose bytes 4r .. 4r + 3 are the block's code bytes 4v .. 4v + 3 of row 16g + r:
  their low nibbles are columns 32b + 4v .. 32b + 4v + 3, their high nibbles the same columns + 16;
- exponents[g, b, r]: the block's E8M0 byte of row 16g + r;
- row_scale[g, r]: row 16g + r's float32 scale.
Half a byte a weight, a byte per 32 and four per row: 4.25 bits a weight, as the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.weights.mxfp4_blocks import MXFP4, MXFP4_BLOCK, MXFP4Blocks, e8m0_half, file_codes, weights
from worker.engine.weights.read_only import freeze_arrays

TILE_ROWS = 16  # weight rows interleaved in a group
VECTOR_BYTES = 64  # bytes of one code vector: four code bytes of each of the sixteen rows
VECTORS = MXFP4_BLOCK // 2 // 4  # code vectors per block


@dataclass(frozen=True)
class InterleavedMXFP4:
    """An (out, in) MXFP4 matrix in the module docstring's layout."""

    codes: np.ndarray  # (G, B, 4, 64) uint8
    exponents: np.ndarray  # (G, B, 16) uint8
    row_scale: np.ndarray  # (G, 16) float32
    out: int  # rows of the matrix (16 G, less the last group's padding)

    kind = MXFP4

    def __post_init__(self) -> None:
        freeze_arrays(self, self.arrays())

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the matrix."""
        return self.out, self.codes.shape[1] * MXFP4_BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes of every array."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays, by name."""
        return {"codes": self.codes, "exponents": self.exponents, "row_scale": self.row_scale}

    def _rows(self, index: np.ndarray | slice) -> np.ndarray:
        """The row numbers an index names: (N,)."""
        return np.arange(self.out)[index] if isinstance(index, slice) else np.asarray(index)

    def file_bytes(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' code bytes in the file's order: (N, in/2) uint8."""
        rows = self._rows(index)  # (N,)
        groups, blocks, _, _ = self.codes.shape
        lanes = self.codes.reshape(groups, blocks, VECTORS, TILE_ROWS, 4)  # (G, B, V, 16, 4)
        return np.ascontiguousarray(lanes[rows // TILE_ROWS, :, :, rows % TILE_ROWS].reshape(len(rows), -1))

    def code_rows(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' codes (0..15), one a byte, in column order: (N, in) uint8."""
        return file_codes(self.file_bytes(index))

    def block_scale(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' block scales, float32(E8M0_HALF(e) * row_scale): (N, in/32)."""
        rows = self._rows(index)  # (N,)
        exponents = self.exponents[rows // TILE_ROWS, :, rows % TILE_ROWS]  # (N, B): only those rows are read
        return e8m0_half(exponents) * self.row_scale[rows // TILE_ROWS, rows % TILE_ROWS][:, None]  # (N, B)

    def rows(self, index: np.ndarray | slice) -> np.ndarray:
        """Some rows dequantized to float32 (an embedding lookup reads only those rows): (N, in)."""
        return weights(self.code_rows(index), self.block_scale(index))  # (N, in)

    def dequantize(self) -> np.ndarray:
        """The float32 matrix: (out, in)."""
        return self.rows(slice(None))  # (out, in)


def interleave_mxfp4(blocks: MXFP4Blocks) -> InterleavedMXFP4:
    """An MXFP4 matrix in the interleaved form."""
    rows, cols = blocks.shape
    groups, count = -(-rows // TILE_ROWS), cols // MXFP4_BLOCK
    padding = groups * TILE_ROWS - rows
    codes = np.pad(blocks.codes, ((0, padding), (0, 0)))  # (16 G, in/2)
    split = codes.reshape(groups, TILE_ROWS, count, VECTORS, 4)  # (G, 16, B, V, 4)
    laid = split.transpose(0, 2, 3, 1, 4).reshape(groups, count, VECTORS, VECTOR_BYTES)  # (G, B, V, 64)
    exponents = np.pad(blocks.exponents, ((0, padding), (0, 0)))  # (16 G, B)
    row_scale = np.pad(blocks.row_scale.astype(np.float32), (0, padding))  # (16 G,)
    return InterleavedMXFP4(np.ascontiguousarray(laid, np.uint8),
                            np.ascontiguousarray(exponents.reshape(groups, TILE_ROWS, count).transpose(0, 2, 1)),
                            np.ascontiguousarray(row_scale.reshape(groups, TILE_ROWS)), rows)
