"""Q4_K, Q5_K and Q6_K tensors in the file's own form: 4-, 5- or 6-bit codes, integer sub-scales and a float scale
per super-block of 256 columns, as decoded from the file (interleaved_k_blocks.py builds the form the kernels take).

A Q4_K or Q5_K weight is d * sc[g] * code - dmin * m[g] (codes 0..15 or 0..31, sc and m 0..63 per group of 32
columns); a Q6_K weight is d * sc[g] * (code - 32) (codes 0..63, sc -128..127 per group of 16). The codes are held
as the file's own bytes, per row and super-block:
- Q4_K, Q5_K `codes` (128 bytes): part p (32 bytes) holds columns 64p + j in the low four bits of byte j and
  64p + 32 + j in the high four; Q5_K's `high` (32 bytes): byte j holds bit 4 of column 32i + j in bit i;
- Q6_K `codes` (128 bytes): half t (64 bytes) holds columns 128t + j (j < 32) and 128t + 32 + j in the low four bits
  of bytes j and 32 + j, columns 128t + 64 + j and 128t + 96 + j in their high four; `high` (64 bytes): byte 32t + j
  holds bits 4-5 of column 128t + 32i + j in bits 2i, 2i + 1.
The sub-scales are held as bytes, d and dmin as float32 per row and super-block.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from worker.engine.weights.quant_blocks import QK_K, f16_values, k_scales

K_KINDS = ("Q4_K", "Q5_K", "Q6_K")  # decoded into this form
ARRAYS = ("codes", "high", "scales", "mins", "d", "dmin")


def code_bytes(codes: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Codes (out, in) (0..15, 0..31 or 0..63) as this form holds them: `codes` (out, in/2) and `high` (out, in/8 for
    Q5_K, in/4 for Q6_K; None for Q4_K) uint8 (the inverse of KBlocks.code_rows)."""
    rows, cols = codes.shape
    supers = codes.reshape(rows, cols // QK_K, QK_K)  # (out, S, 256)
    if kind == "Q6_K":
        half = supers.reshape(rows, -1, 2, 4, 32)  # (out, S, t, block, 32)
        low = (half[:, :, :, 0:2] & 0x0F) | ((half[:, :, :, 2:4] & 0x0F) << 4)  # (out, S, t, 2, 32)
        high = np.zeros(half.shape[:3] + (32,), np.uint8)  # (out, S, t, 32)
        for i in range(4):
            high |= ((half[:, :, :, i] >> 4) & 3) << (2 * i)
        return low.reshape(rows, cols // 2), high.reshape(rows, cols // 4)
    parts = supers.reshape(rows, -1, 4, 2, 32)  # (out, S, part, low/high, 32)
    low = (parts[:, :, :, 0] & 0x0F) | ((parts[:, :, :, 1] & 0x0F) << 4)  # (out, S, part, 32)
    if kind == "Q4_K":
        return low.reshape(rows, cols // 2), None
    blocks = supers.reshape(rows, -1, 8, 32)  # (out, S, block, 32)
    fifth = np.zeros(blocks.shape[:2] + (32,), np.uint8)  # (out, S, 32)
    for i in range(8):
        fifth |= ((blocks[:, :, i] >> 4) & 1) << i
    return low.reshape(rows, cols // 2), fifth.reshape(rows, cols // 8)


def file_codes(kind: str, codes: np.ndarray, high: np.ndarray | None) -> np.ndarray:
    """Codes one a byte, (N, in) uint8, from the file's bytes of N rows: `codes` (N, in/2) and `high` (N, in/8 for
    Q5_K, in/4 for Q6_K; None for Q4_K), as the module docstring lays them out (the inverse of code_bytes)."""
    n, half = codes.shape
    if kind == "Q6_K":
        low = codes.reshape(n, -1, 2, 1, 2, 32)  # (N, S, t, 1, 2, 32)
        nibbles = np.concatenate([low & 0x0F, low >> 4], axis=3).reshape(n, -1, 2, 4, 32)  # (N, S, t, block, 32)
        assert high is not None
        bits = high.reshape(n, -1, 2, 1, 32)  # (N, S, t, 1, 32)
        shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, None, :, None]  # (1, 1, 1, 4, 1)
        return (nibbles | (((bits >> shifts) & 3) << 4)).reshape(n, 2 * half)  # (N, in)
    parts = codes.reshape(n, -1, 4, 1, 32)  # (N, S, part, 1, 32)
    nibbles = np.concatenate([parts & 0x0F, parts >> 4], axis=3).reshape(n, -1, 8, 32)  # (N, S, block, 32)
    if high is None:
        return nibbles.reshape(n, 2 * half)  # (N, in)
    fifth = high.reshape(n, -1, 1, 32)  # (N, S, 1, 32)
    shifts = np.arange(8, dtype=np.uint8)[None, None, :, None]  # (1, 1, 8, 1)
    return (nibbles | (((fifth >> shifts) & 1) << 4)).reshape(n, 2 * half)  # (N, in)


@dataclass(frozen=True)
class KBlocks:
    """An (out, in) Q4_K, Q5_K or Q6_K matrix in the file's form (arrays named as in ARRAYS; None where the kind has
    none)."""

    kind: str  # "Q4_K", "Q5_K" or "Q6_K"
    codes: np.ndarray  # (out, in/2) uint8: the low four bits of each code, two a byte, as the file orders them
    scales: np.ndarray  # (out, in/32) uint8 for Q4_K and Q5_K, (out, in/16) int8 for Q6_K
    d: np.ndarray  # (out, in/256) float32
    high: np.ndarray | None = None  # Q6_K: (out, in/4) uint8, bits 4-5 of each code; Q5_K: (out, in/8), bit 4
    mins: np.ndarray | None = None  # Q4_K, Q5_K: (out, in/32) uint8
    dmin: np.ndarray | None = None  # Q4_K, Q5_K: (out, in/256) float32

    @property
    def group(self) -> int:
        """Columns per sub-scale."""
        return 16 if self.kind == "Q6_K" else 32

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the matrix."""
        return self.codes.shape[0], 2 * self.codes.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of every array."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays this kind has, by name."""
        return {name: getattr(self, name) for name in ARRAYS if getattr(self, name) is not None}

    def code_rows(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' codes, one a byte: (N, in) uint8 (0..15, 0..31 or 0..63)."""
        return file_codes(self.kind, self.codes[index], None if self.high is None else self.high[index])

    def tables(self, index: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Per-group float32 scale and offset of some rows, w = code * scale + offset: (N, in/G) each."""
        per_super = QK_K // self.group
        d = np.repeat(self.d[index], per_super, axis=1)  # (N, in/G)
        scale = d * self.scales[index].astype(np.float32)  # (N, in/G)
        if self.kind == "Q6_K":
            return scale, np.float32(-32.0) * scale
        assert self.mins is not None and self.dmin is not None
        dmin = np.repeat(self.dmin[index], per_super, axis=1)  # (N, in/G)
        return scale, -(dmin * self.mins[index].astype(np.float32))

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Some rows dequantized to float32 (an embedding lookup): (N, in)."""
        codes = self.code_rows(index)  # (N, in)
        n, cols = codes.shape
        scale, offset = self.tables(index)  # (N, in/G) each
        grouped = codes.reshape(n, cols // self.group, self.group).astype(np.float32)  # (N, in/G, G)
        return (grouped * scale[:, :, None] + offset[:, :, None]).reshape(n, cols)  # (N, in)

    def dequantize(self) -> np.ndarray:
        """The float32 matrix: (out, in)."""
        return self.rows(np.arange(self.shape[0]))  # (out, in)

    def take_rows(self, order: np.ndarray) -> KBlocks:
        """Rows reordered by the index array `order` (out,)."""
        taken = {name: np.ascontiguousarray(array[order]) for name, array in self.arrays().items()}
        return replace(self, **taken)

    def scaled(self, factor: np.float32) -> KBlocks:
        """Every row multiplied by one factor (d and dmin scaled)."""
        dmin = None if self.dmin is None else self.dmin * np.float32(factor)
        return replace(self, d=self.d * np.float32(factor), dmin=dmin)

    def stacked(self, others: list[KBlocks]) -> KBlocks:
        """This matrix's rows followed by others' of the same kind: (sum out, in)."""
        parts = [self, *others]
        joined = {name: np.concatenate([p.arrays()[name] for p in parts], axis=0) for name in self.arrays()}
        return replace(self, **joined)


def has_k_form(kind: str, cols: int) -> bool:
    """Whether a tensor of this type and row length is held in this form (else as 8-bit block codes)."""
    return kind in K_KINDS and cols % QK_K == 0


def decode_k_blocks(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> KBlocks:
    """A Q4_K, Q5_K or Q6_K tensor (raw bytes per row as GGUF stores them) in this form: the code bytes copied as
    they are, the scales widened."""
    rows, cols = shape
    n = rows * (cols // QK_K)
    blocks = np.ascontiguousarray(raw).reshape(n, -1)  # (n, bytes per super-block)
    if kind == "Q6_K":
        ql = blocks[:, : QK_K // 2]  # (n, 128)
        qh = blocks[:, QK_K // 2 : QK_K // 2 + QK_K // 4]  # (n, 64)
        scales = blocks[:, QK_K // 2 + QK_K // 4 : QK_K // 2 + QK_K // 4 + 16].view(np.int8)  # (n, 16)
        return KBlocks(kind, np.ascontiguousarray(ql).reshape(rows, cols // 2),
                       np.ascontiguousarray(scales).reshape(rows, -1), f16_values(blocks[:, -2:]).reshape(rows, -1),
                       high=np.ascontiguousarray(qh).reshape(rows, cols // 4))
    if kind not in ("Q4_K", "Q5_K"):
        raise ValueError(f"{kind} has no super-block form here")
    fifth = 0 if kind == "Q4_K" else QK_K // 8  # Q5_K's 32 bytes of fifth bits before the nibbles
    high = np.ascontiguousarray(blocks[:, 16 : 16 + fifth]).reshape(rows, cols // 8) if fifth else None
    sc, mins = k_scales(blocks[:, 4:16])  # (n, 8) each, float32 of 0..63
    return KBlocks(kind, np.ascontiguousarray(blocks[:, 16 + fifth :]).reshape(rows, cols // 2),
                   sc.astype(np.uint8).reshape(rows, -1), f16_values(blocks[:, 0:2]).reshape(rows, -1), high=high,
                   mins=mins.astype(np.uint8).reshape(rows, -1), dmin=f16_values(blocks[:, 2:4]).reshape(rows, -1))
