"""GGUF quantized tensors as 8-bit codes with a scale and an offset per group: w = code * scale + offset, exactly.

Every llama.cpp format below stores, per group of 16 or 32 weights, small unsigned integers and an affine map
(Q8_0's signed codes are shifted by 128 and the shift moved into the offset). Keeping that form (1 byte per
weight instead of 4) lets decode read a quarter of the memory float32 weights need. Formats not listed (Q2_K,
Q3_K, the IQ types) return None and stay float32 only. This is the decoded form a recipe transforms (row order,
row scales, fusing); the kernels take K-quants in their own form (k_blocks.py) and the 32-weight formats
interleaved (interleaved_blocks.py). MXFP4 (no affine map: its codes index a table of FP4 values) has a form of its
own only (mxfp4_blocks.py); this module's registries (SUPPORTED, held_bytes, code_group) name it too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from worker.engine.weights.mxfp4_blocks import MXFP4, MXFP4_BLOCK

QK_K = 256  # weights per K-quant super-block


LEGACY_BLOCK = 32  # weights per block of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0


@dataclass(frozen=True)
class BlockCodes:
    """A (out, in) matrix as codes (out, in) uint8 and per-group scale/offset (out, in/group) float32."""

    codes: np.ndarray  # (out, in) uint8
    scale: np.ndarray  # (out, in/G) float32
    offset: np.ndarray  # (out, in/G) float32
    group: int

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the matrix the codes stand for."""
        rows, width = self.codes.shape
        return rows, width

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and the per-group tables."""
        return self.codes.nbytes + self.scale.nbytes + self.offset.nbytes

    def code_rows(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' codes: (N, in) uint8."""
        return self.codes[index]

    def dequantize(self) -> np.ndarray:
        """The float32 matrix the codes stand for: (out, in)."""
        rows, cols = self.shape
        grouped = self.code_rows().reshape(rows, cols // self.group, self.group).astype(np.float32)  # (out, in/G, G)
        return (grouped * self.scale[:, :, None] + self.offset[:, :, None]).reshape(rows, cols)  # (out, in)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Some rows dequantized to float32 (an embedding lookup): (N, in)."""
        codes = self.code_rows(index)  # (N, in) uint8
        n, cols = codes.shape
        grouped = codes.reshape(n, cols // self.group, self.group).astype(np.float32)  # (N, in/G, G)
        grouped *= self.scale[index][:, :, None]
        grouped += self.offset[index][:, :, None]
        return grouped.reshape(n, cols)  # (N, in)

    def take_rows(self, order: np.ndarray) -> BlockCodes:
        """Rows reordered by the index array `order` (out,)."""
        return replace(self, codes=np.ascontiguousarray(self.codes[order]), scale=np.ascontiguousarray(self.scale[order]),
                       offset=np.ascontiguousarray(self.offset[order]))

    def scaled(self, factor: np.float32) -> BlockCodes:
        """Every row multiplied by one factor (scale and offset scaled)."""
        return replace(self, scale=self.scale * np.float32(factor), offset=self.offset * np.float32(factor))


def f16_values(column: np.ndarray) -> np.ndarray:
    """Little-endian float16 bytes (n, 2) as float32 (n,)."""
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32).reshape(-1)  # (n,)


def _nibbles(packed: np.ndarray, half: int) -> np.ndarray:
    """Low nibbles then high nibbles of each run of `half` bytes: (n, 2*half) uint8 from (n, half)."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # (n, 2*half)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Bit i of the little-endian uint32 of each row, for i < count: (n, count) uint8."""
    bits = np.ascontiguousarray(qh).view(np.uint32).reshape(-1, 1) >> np.arange(count, dtype=np.uint32)  # (n, count)
    return (bits & 1).astype(np.uint8)


def _legacy(blocks: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 blocks (n, bytes) of 32 weights: codes (n, 32), scale (n,), offset (n,)."""
    d = f16_values(blocks[:, :2])  # (n,)
    if kind == "Q8_0":
        return (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128.0 * d
    has_min = kind in ("Q4_1", "Q5_1")
    m = f16_values(blocks[:, 2:4]) if has_min else None  # (n,)
    at = 4 if has_min else 2
    codes = None
    if kind.startswith("Q5"):
        high = _high_bits(blocks[:, at : at + 4], 32)  # (n, 32)
        at += 4
        codes = _nibbles(blocks[:, at : at + 16], 16) | (high << 4)  # (n, 32)
    else:
        codes = _nibbles(blocks[:, at : at + 16], 16)  # (n, 32)
    if m is not None:
        return codes, d, m
    return codes, d, -(8.0 if kind == "Q4_0" else 16.0) * d


def k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K super-block: (n, 8) each."""
    d, m, m_d = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]  # (n, 4) each
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)  # (n, 8)
    mins = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)  # (n, 8)
    return sc.astype(np.float32), mins.astype(np.float32)


def _k_quant(blocks: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K, Q5_K (groups of 32) and Q6_K (groups of 16) super-blocks: codes (n, 256), scale/offset (n, groups)."""
    n = blocks.shape[0]
    if kind == "Q6_K":
        ql = blocks[:, : QK_K // 2].reshape(n, 2, 64)  # (n, 2, 64): two halves of 128 weights
        qh = blocks[:, QK_K // 2 : QK_K // 2 + QK_K // 4].reshape(n, 2, 32)  # (n, 2, 32)
        scales = blocks[:, QK_K // 2 + QK_K // 4 : QK_K // 2 + QK_K // 4 + 16].view(np.int8).astype(np.float32)  # (n, 16)
        d = f16_values(blocks[:, -2:])  # (n,)
        low = np.concatenate([ql & 0x0F, ql >> 4], axis=-1).reshape(n, 2, 4, 32)  # (n, 2, 4, 32)
        high = (qh[:, :, None, :] >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 0x03  # (n, 2, 4, 32)
        codes = (low | (high << 4)).reshape(n, QK_K)  # (n, 256) in 0..63
        scale = d[:, None] * scales  # (n, 16)
        return codes, scale, -32.0 * scale
    d, dmin = f16_values(blocks[:, 0:2]), f16_values(blocks[:, 2:4])  # (n,) each
    sc, mins = k_scales(blocks[:, 4:16])  # (n, 8) each
    if kind == "Q5_K":
        qh = blocks[:, 16 : 16 + QK_K // 8]  # (n, 32)
        qs = blocks[:, 16 + QK_K // 8 :].reshape(n, 4, 32)  # (n, 4, 32)
        high = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1)  # (n, 8, 32)
    else:
        qs = blocks[:, 16:].reshape(n, 4, 32)  # (n, 4, 32)
        high = None
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)  # (n, 8, 32)
    codes = low if high is None else low | (high << 4)  # (n, 8, 32)
    return codes.reshape(n, QK_K), d[:, None] * sc, -(dmin[:, None] * mins)


_LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
_K_QUANTS = {"Q4_K": 32, "Q5_K": 32, "Q6_K": 16}
BLOCK_CODED = _LEGACY + tuple(_K_QUANTS)  # the types decode_block_codes decodes
SUPPORTED = BLOCK_CODED + (MXFP4,)  # the types kept quantized


def held_bytes(kind: str, count: int) -> int:
    """Bytes the engine holds for `count` weights of a SUPPORTED type. Q4_K, Q5_K and Q6_K keep the file's form
    (k_blocks.py: codes, byte sub-scales, float32 d per 256: 0.59, 0.72 and 0.83 bytes a weight; an upper bound, as
    interleaved_k_blocks keeps d and dmin as float16 where that is exact: 0.578, 0.703 and 0.820); the 32-weight
    formats are interleaved codes (interleaved_blocks.py: half a byte each for Q4_0 and Q4_1, else one) with a
    float32 scale per block, and an offset for Q4_1 and Q5_1 (0.625, 0.75, 1.125, 1.25 and Q8_0's 1.125); MXFP4
    keeps the file's bytes (mxfp4_blocks.py: 0.53 bytes a weight, and a float32 per row not counted here)."""
    if kind == MXFP4:
        return count // 2 + count // MXFP4_BLOCK
    if kind in ("Q4_K", "Q5_K"):
        return count // 2 + (count // 8 if kind == "Q5_K" else 0) + count // 32 * 2 + count // QK_K * 8
    if kind == "Q6_K":
        return count // 2 + count // 4 + count // 16 + count // QK_K * 4
    tables = 8 if kind in ("Q4_1", "Q5_1") else 4
    return (count // 2 if kind.startswith("Q4") else count) + count // LEGACY_BLOCK * tables


def code_group(kind: str, cols: int) -> int | None:
    """The group size of a type's codes for rows of `cols` weights; None when it has no block form."""
    if kind in _LEGACY or kind == MXFP4:
        return 32 if cols % 32 == 0 else None
    if kind in _K_QUANTS:
        return _K_QUANTS[kind] if cols % QK_K == 0 else None
    return None


def decode_block_codes(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> BlockCodes | None:
    """Codes and per-group scale/offset of a 2-D quantized tensor (raw bytes per row as GGUF stores them); None for
    a type not in BLOCK_CODED or a row length its blocks do not divide."""
    rows, cols = shape
    group = code_group(kind, cols)
    if group is None or kind not in BLOCK_CODED:
        return None
    super_block = 32 if kind in _LEGACY else QK_K
    blocks = np.ascontiguousarray(raw).reshape(rows * (cols // super_block), -1)  # (n, bytes per block)
    if kind in _LEGACY:
        codes, scale, offset = _legacy(blocks, kind)
    else:
        codes, scale, offset = _k_quant(blocks, kind)
    return BlockCodes(
        codes=np.ascontiguousarray(codes.reshape(rows, cols), dtype=np.uint8),  # (out, in)
        scale=np.ascontiguousarray(scale.reshape(rows, cols // group), dtype=np.float32),  # (out, in/G)
        offset=np.ascontiguousarray(offset.reshape(rows, cols // group), dtype=np.float32),  # (out, in/G)
        group=group,
    )
