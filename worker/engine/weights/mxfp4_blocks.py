"""MXFP4 tensors (GGML type 39: gpt-oss's expert weights) in the file's own form, as decoded from the file
(interleaved_mxfp4.py builds the form the kernel takes).

A block of 32 weights is one E8M0 exponent byte `e` and 16 bytes of four-bit codes: byte j holds column j in its low
nibble and column 16 + j in its high one. A weight is KVALUES[code] * E8M0_HALF(e), where KVALUES are the FP4 (E2M1)
values doubled and E8M0_HALF(e) = 2**(e - 128) (ggml-impl.h's ggml_e8m0_to_fp32_half: the float32 bits (e - 1) << 23,
and for e = 0 and 1 the subnormals 2**-128 and 2**-127), a power of two that float32 holds exactly. The form keeps
the code bytes and the exponent bytes as the file has them (4.25 bits a weight), and one float32 per row: the row's
scale (1 unless a loader scaled the rows), so that a block's scale is float32(E8M0_HALF(e) * row_scale).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

MXFP4 = "MXFP4"  # the GGML type name
MXFP4_BLOCK = 32  # weights per block
BLOCK_BYTES = 1 + MXFP4_BLOCK // 2  # the exponent, then 16 code bytes
KVALUES = np.array((0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), np.int8)  # (16,) kvalues_mxfp4


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """GGML_E8M0_TO_FP32_HALF of exponent bytes, exactly: float32 of e's shape."""
    wide = np.asarray(e, np.uint8).astype(np.uint32)  # (...,)
    subnormal = np.uint32(0x00200000) << (wide & np.uint32(1))  # (...,) e = 0, 1: 2**-128, 2**-127
    normal = (wide - np.uint32(1)) << np.uint32(23)  # (...,) e >= 2: 2**(e - 128) (wraps, unused, at e = 0)
    return np.where(wide < 2, subnormal, normal).astype(np.uint32).view(np.float32)


def file_codes(packed: np.ndarray) -> np.ndarray:
    """Codes 0..15 in column order, (N, in) uint8, from N rows of the file's code bytes (N, in/2)."""
    n, half = packed.shape
    blocks = packed.reshape(n, half // 16, 1, 16)  # (N, B, 1, 16)
    return np.concatenate([blocks & 0x0F, blocks >> 4], axis=2).reshape(n, 2 * half)  # (N, in)


def weights(codes: np.ndarray, block_scale: np.ndarray) -> np.ndarray:
    """Codes (N, in) with per-block float32 scales (N, in/32) as float32 weights (N, in): KVALUES[code] * scale."""
    n, cols = codes.shape
    values = KVALUES[codes].astype(np.float32).reshape(n, cols // MXFP4_BLOCK, MXFP4_BLOCK)  # (N, B, 32)
    with np.errstate(over="ignore"):  # e = 254, 255 reach past float32 for the larger codes: inf, as llama.cpp's
        return (values * block_scale[:, :, None]).reshape(n, cols)  # (N, in)


def _split(raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The exponents (rows, in/32) and code bytes (rows, in/2) of raw bytes per row as GGUF stores them."""
    rows, cols = shape
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // MXFP4_BLOCK, BLOCK_BYTES)  # (rows, B, 17)
    return np.ascontiguousarray(blocks[:, :, 0]), np.ascontiguousarray(blocks[:, :, 1:]).reshape(rows, cols // 2)


def dequantize_mxfp4(raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The float32 matrix (rows, in) of raw MXFP4 bytes per row, as llama.cpp's dequantize_row_mxfp4 computes it."""
    exponents, packed = _split(raw, shape)  # (rows, B), (rows, in/2)
    return weights(file_codes(packed), e8m0_half(exponents))  # (rows, in)


@dataclass(frozen=True)
class MXFP4Blocks:
    """An (out, in) MXFP4 matrix in the file's form, with a float32 scale per row."""

    codes: np.ndarray  # (out, in/2) uint8: the file's code bytes, block by block
    exponents: np.ndarray  # (out, in/32) uint8: the file's E8M0 bytes
    row_scale: np.ndarray  # (out,) float32

    kind = MXFP4

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the matrix."""
        return self.codes.shape[0], 2 * self.codes.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of every array."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays, by name."""
        return {"codes": self.codes, "exponents": self.exponents, "row_scale": self.row_scale}

    def code_rows(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' codes (0..15), one a byte, in column order: (N, in) uint8."""
        return file_codes(self.codes[index])

    def block_scale(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Some rows' block scales, float32(E8M0_HALF(e) * row_scale): (N, in/32)."""
        return e8m0_half(self.exponents[index]) * self.row_scale[index][:, None]  # (N, B)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Some rows dequantized to float32 (an embedding lookup): (N, in)."""
        return weights(self.code_rows(index), self.block_scale(index))  # (N, in)

    def dequantize(self) -> np.ndarray:
        """The float32 matrix: (out, in)."""
        return self.rows(np.arange(self.shape[0]))  # (out, in)

    def take_rows(self, order: np.ndarray) -> MXFP4Blocks:
        """Rows reordered by the index array `order` (out,)."""
        return MXFP4Blocks(**{name: np.ascontiguousarray(array[order]) for name, array in self.arrays().items()})

    def scaled(self, factor: np.float32) -> MXFP4Blocks:
        """Every row multiplied by one factor (the row scales)."""
        return replace(self, row_scale=(self.row_scale * np.float32(factor)).astype(np.float32))

    def stacked(self, others: list[MXFP4Blocks]) -> MXFP4Blocks:
        """This matrix's rows followed by others': (sum out, in)."""
        parts = [self, *others]
        return MXFP4Blocks(**{name: np.concatenate([p.arrays()[name] for p in parts]) for name in self.arrays()})


def decode_mxfp4(raw: np.ndarray, shape: tuple[int, int]) -> MXFP4Blocks:
    """An MXFP4 tensor (raw bytes per row as GGUF stores them) in this form: the file's bytes copied, row scales 1."""
    exponents, packed = _split(raw, shape)  # (rows, B), (rows, in/2)
    return MXFP4Blocks(packed, exponents, np.ones(shape[0], np.float32))
