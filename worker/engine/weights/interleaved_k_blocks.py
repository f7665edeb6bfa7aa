"""Q4_K, Q5_K and Q6_K matrices (super-blocks of 256 weights) with sixteen rows interleaved, the form
interleaved_k_matmul.py multiplies with: built once at load (and kept in the repack cache) from the file's
super-blocks, so that no step transposes anything and one 512-bit load holds four code bytes of sixteen rows.

The codes keep the file's own bytes (k_blocks.py's layout), only interleaved: for row group g (rows 16g .. 16g + 15;
the last group padded with zero rows) and super-block s, every 64-byte vector has row 16g + r in bytes 4r .. 4r + 3,
- low[g, s, v]: bytes 4v .. 4v + 3 of each row's 128 code bytes of the super-block (the low four bits of two codes
  a byte: k_blocks.py says which);
- high[g, s, v]: bytes 4v .. 4v + 3 of each row's Q5_K fifth bits (32 bytes, v < 8) or Q6_K bits 4-5 (64 bytes,
  v < 16);
- scales[g, s, j, r] (Q4_K, Q5_K: uint8, j < 8) or scales[g, s, i, r] (Q6_K's sixteen groups of 16 columns, int8):
  the sub-scales; Q4_K's and Q5_K's mins[g, s, h, 2r + b] (uint8): the min of block 2h + b;
- d[g, s, r] and Q4_K's and Q5_K's dmin[g, s, r]: float16 bits (uint16) where every value of the matrix is a
  float16 (as the file's are), else float32 (a factor folded in at load, such as Llama's 1/sqrt(128) query scale,
  can leave a d that no float16 holds: `half_scales` decides per matrix, and the kernels read either exactly).
Building it is a transpose of the file's bytes. A Q4_K or Q5_K weight is d * sc * code - dmin * m, a Q6_K one
d * sc * (code - 32): 0.578, 0.703 and 0.820 bytes a weight with float16 scales (the file's 0.5625, 0.6875 and
0.8203: its sub-scales and mins are packed in six bits, ours a byte each), 0.594, 0.719 and 0.828 with float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.weights.k_blocks import KBlocks, file_codes
from worker.engine.weights.quant_blocks import QK_K
from worker.engine.weights.read_only import freeze_arrays

TILE_ROWS = 16  # weight rows interleaved in a group
VECTOR_BYTES = 64  # bytes of one vector: sixteen rows' four bytes
INTERLEAVED_K_KINDS = ("Q4_K", "Q5_K", "Q6_K")  # held in this form


@dataclass(frozen=True)
class InterleavedK:
    """An (out, in) Q4_K, Q5_K or Q6_K matrix in the module docstring's layout (None where the kind has none)."""

    kind: str  # "Q4_K", "Q5_K" or "Q6_K"
    low: np.ndarray  # (G, S, 32, 64) uint8
    scales: np.ndarray  # (G, S, 8, 16) uint8 (Q4_K, Q5_K) or (G, S, 16, 16) int8 (Q6_K)
    d: np.ndarray  # (G, S, 16) float32, or uint16 holding float16 bits (the module docstring)
    out: int  # rows of the matrix (16 G, less the last group's padding)
    high: np.ndarray | None = None  # Q5_K: (G, S, 8, 64), Q6_K: (G, S, 16, 64) uint8
    mins: np.ndarray | None = None  # Q4_K, Q5_K: (G, S, 4, 32) uint8
    dmin: np.ndarray | None = None  # Q4_K, Q5_K: (G, S, 16), d's dtype

    def __post_init__(self) -> None:
        freeze_arrays(self, self.arrays())

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the matrix."""
        return self.out, self.low.shape[1] * QK_K

    @property
    def nbytes(self) -> int:
        """Bytes of every array."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays this matrix has, by name."""
        names = ("low", "scales", "d", "high", "mins", "dmin")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def d_values(self) -> np.ndarray:
        """d as float32: (G, S, 16)."""
        return scale_values(self.d)  # (G, S, 16)

    def dmin_values(self) -> np.ndarray:
        """dmin as float32 (Q4_K, Q5_K): (G, S, 16)."""
        assert self.dmin is not None
        return scale_values(self.dmin)  # (G, S, 16)

    def row_lanes(self, table: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Some rows of a (G, S, V, 16 * w) table as (N, S, V, w)."""
        groups, supers, count, width = table.shape
        per_row = width // TILE_ROWS
        lanes = table.reshape(groups, supers, count, TILE_ROWS, per_row)  # (G, S, V, 16, w)
        return lanes[rows // TILE_ROWS, :, :, rows % TILE_ROWS]  # (N, S, V, w)

    def code_rows(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' codes, one a byte: (N, in) uint8 (0..15, 0..31 or 0..63)."""
        rows = np.arange(self.out)[index] if isinstance(index, slice) else np.asarray(index)  # (N,)
        low = self.row_lanes(self.low, rows).reshape(len(rows), -1)  # (N, in/2): the file's code bytes
        high = None if self.high is None else self.row_lanes(self.high, rows).reshape(len(rows), -1)  # (N, in/8|4)
        return file_codes(self.kind, low, high)  # (N, in)

    def tables(self, index: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Per-group float32 scale and offset of some rows, w = code * scale + offset: (N, in/G) each (G: 32 for
        Q4_K and Q5_K, 16 for Q6_K)."""
        rows = np.arange(self.out)[index] if isinstance(index, slice) else np.asarray(index)  # (N,)
        n = len(rows)
        d = scale_values(self.row_lanes(self.d[:, :, None], rows)).reshape(n, -1, 1)  # (N, S, 1): only these rows widen
        scale = (d * self.row_lanes(self.scales, rows).reshape(n, d.shape[1], -1).astype(np.float32))  # (N, S, groups)
        if self.kind == "Q6_K":
            return scale.reshape(n, -1), (np.float32(-32.0) * scale).reshape(n, -1)
        assert self.mins is not None and self.dmin is not None
        dmin = scale_values(self.row_lanes(self.dmin[:, :, None], rows)).reshape(n, -1, 1)  # (N, S, 1)
        mins = self.row_lanes(self.mins, rows).reshape(n, -1, 8).astype(np.float32)  # (N, S, 8): h, b
        return scale.reshape(n, -1), -(dmin * mins).reshape(n, -1)

    def rows(self, index: np.ndarray | slice) -> np.ndarray:
        """Some rows dequantized to float32 (an embedding lookup reads only those rows): (N, in)."""
        codes = self.code_rows(index)  # (N, in)
        n, cols = codes.shape
        scale, offset = self.tables(index)  # (N, in/G) each
        group = cols // scale.shape[1]
        grouped = codes.reshape(n, cols // group, group).astype(np.float32)  # (N, in/G, G)
        return (grouped * scale[:, :, None] + offset[:, :, None]).reshape(n, cols)  # (N, in)

    def dequantize(self) -> np.ndarray:
        """The float32 matrix: (out, in)."""
        return self.rows(slice(None))  # (out, in)


def scale_values(table: np.ndarray) -> np.ndarray:
    """A d or dmin table as float32 (uint16 holds float16 bits)."""
    return table.view(np.float16).astype(np.float32) if table.dtype == np.uint16 else table


def half_scales(*tables: np.ndarray) -> bool:
    """Whether every value of these float32 tables is a float16 (so float16 holds them exactly)."""
    return all(np.array_equal(t.astype(np.float16).astype(np.float32), t) for t in tables)


def interleave_k(blocks: KBlocks) -> InterleavedK:
    """A Q4_K, Q5_K or Q6_K matrix in the interleaved form."""
    if blocks.kind not in INTERLEAVED_K_KINDS:
        raise ValueError(f"{blocks.kind} has no interleaved super-block form")
    rows, cols = blocks.shape
    groups, supers = -(-rows // TILE_ROWS), cols // QK_K
    padding = groups * TILE_ROWS - rows

    def table(values: np.ndarray, dtype: type, width: int = 1) -> np.ndarray:
        """A per-row array (R, S * V * width) as (G, S, V, 16 * width): sixteen rows side by side."""
        padded = np.pad(values, ((0, padding), (0, 0))).astype(dtype, copy=False)  # (16 G, S * V * width)
        split = padded.reshape(groups, TILE_ROWS, supers, -1, width)  # (G, 16, S, V, width)
        return np.ascontiguousarray(split.transpose(0, 2, 3, 1, 4)).reshape(groups, supers, -1, TILE_ROWS * width)

    tables = (blocks.d,) if blocks.dmin is None else (blocks.d, blocks.dmin)
    half = half_scales(*tables)

    def scales_table(values: np.ndarray) -> np.ndarray:
        """d or dmin (R, S) as (G, S, 16): float16 bits where `half`, else float32."""
        lanes = table(values, np.float32)[:, :, 0]  # (G, S, 16)
        return lanes.astype(np.float16).view(np.uint16) if half else lanes

    d = scales_table(blocks.d)  # (G, S, 16)
    low = table(blocks.codes, np.uint8, 4)  # (G, S, 32, 64)
    high = None if blocks.high is None else table(blocks.high, np.uint8, 4)  # (G, S, 8 or 16, 64)
    if blocks.kind == "Q6_K":
        return InterleavedK("Q6_K", low, table(blocks.scales, np.int8), d, rows, high=high)
    assert blocks.mins is not None and blocks.dmin is not None
    mins = table(blocks.mins, np.uint8)  # (G, S, 8, 16): j, r
    paired = mins.reshape(groups, supers, 4, 2, TILE_ROWS).transpose(0, 1, 2, 4, 3).reshape(groups, supers, 4, 32)
    return InterleavedK(blocks.kind, low, table(blocks.scales, np.uint8), d, rows, high=high,
                        mins=np.ascontiguousarray(paired), dmin=scales_table(blocks.dmin))
