"""A GGUF matrix left in the file's own form: its rows of raw block bytes, a read-only view of the mapped file.

Nothing is widened at load: the model's memory is the file's pages, shared through the page cache by every
process that maps the same file. The eight formats with an integer kernel (quant_matmul.py) multiply from these
bytes directly; any other type gguf can dequantize (F16, BF16, Q2_K, Q3_K, the IQ types) takes a slow path that
dequantizes SLOW_PATH_ROWS rows at a time per step and multiplies them in float32, so its temporary memory stays
bounded (and its results are not batch-invariant). An embedding lookup dequantizes only the rows it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.quant_matmul import KINDS, QuantizedActivations, quant_matmul

SLOW_PATH_ROWS = 512  # weight rows dequantized at a time on the slow path


@dataclass(frozen=True)
class QuantizedMatrix:
    """An (out, in) matrix as raw (out, bytes per row) uint8 of GGML type `kind` (a type name such as "Q4_1")."""

    name: str
    kind: str
    raw: np.ndarray  # (out, bytes per row) uint8, a view of the mapped file
    shape: tuple[int, int]  # (out, in)

    @property
    def nbytes(self) -> int:
        """Bytes of the mapped rows (file pages, not private memory)."""
        return int(self.raw.nbytes)

    @property
    def has_kernel(self) -> bool:
        """Whether an integer kernel multiplies this type (else the documented slow path)."""
        return self.kind in KINDS

    def rows(self, index: np.ndarray) -> np.ndarray:
        """The float32 rows at `index` (N,), dequantized from their bytes only: (N, in)."""
        return dequantize_rows(self.raw[np.asarray(index)], self.kind).reshape(len(index), self.shape[1])  # (N, in)

    def matmul(self, x: np.ndarray | QuantizedActivations, out: np.ndarray | None = None) -> np.ndarray:
        """x (N, in) @ self.T: (N, out), row-major (written into `out` when given)."""
        if self.has_kernel:
            activations = x if isinstance(x, QuantizedActivations) else QuantizedActivations(x)
            return quant_matmul(activations, self.kind, self.raw, out)
        if isinstance(x, QuantizedActivations):
            raise TypeError(f"{self.name} ({self.kind}) takes float activations")
        x = np.ascontiguousarray(x, dtype=np.float32)  # (N, in)
        if out is None:
            out = np.empty((x.shape[0], self.shape[0]), np.float32)  # (N, out)
        for first in range(0, self.shape[0], SLOW_PATH_ROWS):
            last = min(self.shape[0], first + SLOW_PATH_ROWS)
            block = dequantize_rows(self.raw[first:last], self.kind)  # (rows, in)
            out[:, first:last] = x @ block.T  # (N, rows)
        return out


def dequantize_rows(raw: np.ndarray, kind: str) -> np.ndarray:
    """gguf's dequantization of raw rows (N, bytes per row): (N, in) float32."""
    import gguf
    from gguf.quants import dequantize

    if kind == "F16":
        return np.asarray(raw).view(np.float16).astype(np.float32)  # (N, in)
    return np.asarray(dequantize(np.asarray(raw), gguf.GGMLQuantizationType[kind]), dtype=np.float32)  # (N, in)
