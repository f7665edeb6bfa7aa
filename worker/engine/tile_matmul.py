"""Wide steps (prefill chunks) over block codes: a tile of weight rows is dequantized into float32 scratch, then
multiplied with BLAS; the next tile reuses the scratch. No float32 copy of a weight matrix outlives the call.

Decoding a weight costs one FMA; a step of K rows spends 2K FLOPs on it in the matmul, so from K = 64 on the
decode is a few per cent of the work, and a tile (TILE_BYTES of float32, in L3) is read by BLAS from cache.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from worker.engine.simd import LANES, vbroadcast, vfma, vload_u8, vstore

TILE_BYTES = 1 << 24  # float32 bytes of weight rows decoded at once (2048 rows of 2048 columns; fits L3). Fewer,
# larger BLAS calls: the 1B's four layer matrices at 500 rows, s, dense / 1, 4, 16 MiB tiles in one run on the
# shared 2-core machine: 0.97-2.1 / 5.9-12.5 / 1.2-3.9 / 1.07-1.8 (each small call pays OpenBLAS's thread hand-off)
_scratch = threading.local()  # a per-thread float32 buffer, kept between calls (no page faults per tile)


@njit(fastmath=True, cache=True)
def _dequantize_rows(codes, scale, offset, first, out):  # pragma: no cover (compiled)
    """out[j, c] = codes[first + j, c] * scale[first + j, c / G] + offset[first + j, c / G]."""
    count, cols = out.shape  # out (T, C) float32; codes (R, C) uint8; scale/offset (R, C/G)
    group = cols // scale.shape[1]
    flat_codes = codes.reshape(-1)  # (R*C,)
    flat_out = out.reshape(-1)  # (T*C,)
    for j in range(count):
        r = first + j
        for g in range(cols // group):
            s = vbroadcast(scale[r, g])  # (8,)
            m = vbroadcast(offset[r, g])  # (8,)
            for c in range(g * group, (g + 1) * group, LANES):
                vstore(flat_out, j * cols + c, vfma(vload_u8(flat_codes, r * cols + c), s, m))  # (8,)


def dequantize_rows(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray, first: int, out: np.ndarray) -> None:
    """Weight rows first..first+len(out)-1 decoded into out (T, C), C-contiguous float32."""
    _dequantize_rows(codes, scale, offset, first, out)


def _scratch_array(name: str, shape: tuple[int, int]) -> np.ndarray:
    """This thread's scratch buffer `name` as a C-contiguous float32 array of `shape`."""
    size = shape[0] * shape[1]
    buffer = getattr(_scratch, name, None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, np.float32)  # (size,)
        setattr(_scratch, name, buffer)
    return buffer[:size].reshape(shape)  # (A, B)


def tile_rows(cols: int, rows: int, tile_bytes: int = TILE_BYTES) -> int:
    """Weight rows per tile for a matrix of `cols` columns: tile_bytes of float32, at least 16, at most all."""
    return min(rows, max(16, tile_bytes // (4 * cols)))


def tiled_matmul(x: np.ndarray, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray,
                 tile_bytes: int = TILE_BYTES) -> np.ndarray:
    """x (K, C) times the block-coded matrix (R, C) transposed: (K, R), column-major (a transposed (R, K))."""
    rows, cols = codes.shape
    out = np.empty((rows, x.shape[0]), np.float32)  # (R, K)
    step = tile_rows(cols, rows, tile_bytes)
    xt = x.T  # (C, K)
    for first in range(0, rows, step):
        count = min(step, rows - first)
        tile = _scratch_array("tile", (count, cols))  # (T, C)
        dequantize_rows(codes, scale, offset, first, tile)
        np.dot(tile, xt, out=out[first : first + count])  # (T, K): as (W @ x.T).T on a float32 W
    return out.T  # (K, R)


def warm() -> None:
    """Compile (or load from numba's cache) the tile decoder for writeable and for read-only (mapped) codes."""
    for writeable in (True, False):
        codes = np.zeros((2, 16), np.uint8)  # (R, C)
        tables = np.zeros((2, 1), np.float32)  # (R, C/G)
        codes.flags.writeable = tables.flags.writeable = writeable
        dequantize_rows(codes, tables, tables, 0, np.empty((2, 16), np.float32))
