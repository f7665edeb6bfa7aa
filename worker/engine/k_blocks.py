"""Q4_K, Q5_K and Q6_K tensors in the file's own form: 4-, 5- or 6-bit codes, integer sub-scales and a float scale
per super-block of 256 columns, multiplied by int_kernels.py with int8 activations.

A Q4_K or Q5_K weight is d * sc[g] * code - dmin * m[g] (codes 0..15 or 0..31, sc and m 0..63 per group of 32
columns); a Q6_K weight is d * sc[g] * (code - 32) (codes 0..63, sc -128..127 per group of 16). Held here: the low
four bits of the codes two a byte in ggml's Q4 order per 32 columns (byte j of a block: column j low, column j + 16
high); Q5_K's fifth bit eight a byte (byte j of a block's 4: columns j, j+4, .., j+28 in bits 0..7); Q6_K's two high
bits four a byte (byte j of a block's 8: columns j, j+8, j+16, j+24 in bit pairs 0-1 .. 6-7); the sub-scales as
bytes and d, dmin as float32 per row and super-block: 0.594 bytes a weight for Q4_K, 0.719 for Q5_K, 0.828 for
Q6_K (the file's 0.5625, 0.6875 and 0.8203 plus float32 instead of float16 scales), where 8-bit codes with float32
tables took 0.75, 1.25 and 1.5.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from worker.engine.quant_blocks import QK_K, BlockCodes, f16_values, k_scales, unpack_nibbles

K_KINDS = ("Q4_K", "Q5_K", "Q6_K")  # held in this form
_BLOCK = 32  # columns of one packed block (and of one int8x32 in the kernels)
ARRAYS = ("codes", "high", "scales", "mins", "d", "dmin")


def pack_high_bits(codes: np.ndarray) -> np.ndarray:
    """Bits 4-5 of 6-bit codes (out, in), four a byte: (out, in/4) uint8, byte 8b + j holding columns 32b + j + 8i
    in bits 2i, 2i+1 (i = 0..3)."""
    rows, cols = codes.shape
    high = ((codes >> 4) & 3).reshape(rows, cols // _BLOCK, 4, 8)  # (out, in/32, i, j)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]  # (1, 1, 4, 1)
    return np.ascontiguousarray(np.bitwise_or.reduce(high << shifts, axis=2).reshape(rows, cols // 4), np.uint8)


def pack_fifth_bits(codes: np.ndarray) -> np.ndarray:
    """Bit 4 of 5-bit codes (out, in), eight a byte: (out, in/8) uint8, byte 4b + j holding column 32b + j + 4i in
    bit i (i = 0..7)."""
    rows, cols = codes.shape
    bits = ((codes >> 4) & 1).reshape(rows, cols // _BLOCK, 8, 4)  # (out, in/32, i, j)
    shifts = np.arange(8, dtype=np.uint8)[None, None, :, None]  # (1, 1, 8, 1)
    return np.ascontiguousarray(np.bitwise_or.reduce(bits << shifts, axis=2).reshape(rows, cols // 8), np.uint8)


def unpack_fifth_bits(high: np.ndarray) -> np.ndarray:
    """The bit 4 (as values 0..1) that pack_fifth_bits packed: (out, in) uint8 from (out, in/8)."""
    rows, eighth = high.shape
    blocks = high.reshape(rows, eighth // 4, 1, 4)  # (out, in/32, 1, j)
    shifts = np.arange(8, dtype=np.uint8)[None, None, :, None]  # (1, 1, 8, 1)
    return ((blocks >> shifts) & 1).reshape(rows, 8 * eighth)  # (out, in)


def unpack_high_bits(high: np.ndarray) -> np.ndarray:
    """The bits 4-5 (as values 0..3) that pack_high_bits packed: (out, in) uint8 from (out, in/4)."""
    rows, quarter = high.shape
    blocks = high.reshape(rows, quarter // 8, 1, 8)  # (out, in/32, 1, j)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]  # (1, 1, 4, 1)
    return ((blocks >> shifts) & 3).reshape(rows, 4 * quarter)  # (out, in)


@dataclass(frozen=True)
class KBlocks:
    """An (out, in) Q4_K or Q6_K matrix in the file's form (arrays named as in ARRAYS; None where the kind has none)."""

    kind: str  # "Q4_K" or "Q6_K"
    codes: np.ndarray  # (out, in/2) uint8: the low four bits of each code, two a byte
    scales: np.ndarray  # (out, in/32) uint8 for Q4_K, (out, in/16) int8 for Q6_K
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
        low = unpack_nibbles(self.codes[index])  # (N, in)
        if self.high is None:
            return low
        unpack = unpack_fifth_bits if self.kind == "Q5_K" else unpack_high_bits
        return low | (unpack(self.high[index]) << 4)  # (N, in)

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

    def as_block_codes(self) -> BlockCodes:
        """The same weights as 8-bit codes with float32 tables (for fusing with another kind)."""
        scale, offset = self.tables()
        return BlockCodes(np.ascontiguousarray(self.code_rows()), np.ascontiguousarray(scale),
                          np.ascontiguousarray(offset), self.group)

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


def _packed_blocks(nibbles: np.ndarray) -> np.ndarray:
    """Blocks of 32 four-bit values (..., 32) packed as pack_nibbles packs them: (..., 16) uint8."""
    return nibbles[..., :16] | (nibbles[..., 16:] << 4)


def _or_planes(bits: np.ndarray, width: int) -> np.ndarray:
    """bits (..., P, J) of `width` bits each ORed into one byte per J, plane p at bit width * p: (..., J) uint8."""
    out = bits[..., 0, :].copy()
    for plane in range(1, bits.shape[-2]):
        out |= bits[..., plane, :] << (width * plane)
    return out


def decode_k_blocks(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> KBlocks:
    """A Q4_K, Q5_K or Q6_K tensor (raw bytes per row as GGUF stores them) in this form, built from the file's bytes
    by whole-array shifts and masks (no per-weight code array: a cold repack is bound by this)."""
    rows, cols = shape
    n = rows * (cols // QK_K)
    blocks = np.ascontiguousarray(raw).reshape(n, -1)  # (n, bytes per super-block)
    if kind == "Q6_K":
        ql = blocks[:, : QK_K // 2].reshape(n, 2, 2, 32)  # (n, half, i % 2, 32): block i's low bits
        qh = blocks[:, QK_K // 2 : QK_K // 2 + QK_K // 4].reshape(n, 2, 32)  # (n, half, 32)
        nibbles = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # (n, half, block 0..3, 32)
        high = (qh[:, :, None, :] >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 0x03  # (n, 2, 4, 32)
        high_bytes = _or_planes(high.reshape(n, 2, 4, 4, 8), 2)  # (n, half, block, 8): columns j + 8i in bits 2i
        scales = blocks[:, QK_K // 2 + QK_K // 4 : QK_K // 2 + QK_K // 4 + 16].view(np.int8)  # (n, 16)
        return KBlocks(kind, _packed_blocks(nibbles).reshape(rows, cols // 2),
                       np.ascontiguousarray(scales.reshape(rows, -1)), f16_values(blocks[:, -2:]).reshape(rows, -1),
                       high=high_bytes.reshape(rows, cols // 4))
    if kind not in ("Q4_K", "Q5_K"):
        raise ValueError(f"{kind} has no super-block form here")
    fifth = 0 if kind == "Q4_K" else QK_K // 8  # Q5_K's 32 bytes of fifth bits before the nibbles
    qs = blocks[:, 16 + fifth :].reshape(n, 4, 1, 32)  # (n, 64-column part, 1, 32)
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # (n, part, low/high: block 2p / 2p + 1, 32)
    high = None
    if fifth:  # byte l of qh holds bit 4 of column l of each of the 8 blocks, block i in bit i
        qh = blocks[:, 16 : 16 + fifth]  # (n, 32)
        bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # (n, block, 32)
        high = _or_planes(bits.reshape(n, 8, 8, 4), 1).reshape(rows, cols // 8)  # columns j + 4i in bit i
    sc, mins = k_scales(blocks[:, 4:16])  # (n, 8) each, float32 of 0..63
    return KBlocks(kind, _packed_blocks(nibbles).reshape(rows, cols // 2), sc.astype(np.uint8).reshape(rows, -1),
                   f16_values(blocks[:, 0:2]).reshape(rows, -1), high=high,
                   mins=mins.astype(np.uint8).reshape(rows, -1), dmin=f16_values(blocks[:, 2:4]).reshape(rows, -1))
