"""Integer matmuls over interleaved Q4_K, Q5_K and Q6_K super-blocks (interleaved_k_blocks.py): x (N, C) times the
matrix (R, C) transposed, with x quantized to int8 per 64 columns (int8_spans.quantize_span; llama.cpp's Q8_K has
one scale per 256: the finer one keeps our error inside llama.cpp's) and every product of codes and activations
summed in integers. One `vpdpbusd` (simd_wide.wdot4) multiplies four codes of each of sixteen weight rows into one x
row's four activations; a sub-scale is applied to a few columns' sums in integers by `vpdpwssd`, which needs them
within int16 (Q4_K: every 16 columns, 16 * 15 * 127 < 32768; Q5_K: every 8, 8 * 31 * 127; Q6_K: every 8 from
-32 S8, so the sum is of (code - 32) * q, 8 * 32 * 127). On the avx2 path the same integers come from `vpmaddubsw`
and `vpmaddwd`, on the generic path from portable LLVM vector code (simd_wide.py).

THE REDUCTION (every step width computes exactly this, so a row's result never depends on the rest of its step):

    activations, per x row k: q, dx[k, 4s + h] per 64 columns (quarter h of super-block s); S32[k, j], S16[k, j] and
      S8[k, j]: the sums of q over columns 32j .. 32j + 31, 16j .. 16j + 15 and 8j .. 8j + 7;
    per weight row r and x row k, over super-blocks s in order and their quarters h = 0..3 in order:
      Q4_K, Q5_K: I = sum over blocks j = 2h, 2h + 1 of sc[j] * (sum over block j's columns of code * q)
            M = m[2h] * S32[k, 8s + 2h] + m[2h + 1] * S32[k, 8s + 2h + 1]
            t = fma(float(M), -dmin[r, s], float32(float(I) * d[r, s]))
      Q6_K: I = sum over groups i = 4h .. 4h + 3 of sc[i] * (sum over group i's columns of code * q
                                                              - 32 S16[k, 16s + i])
            t = float32(float(I) * d[r, s])
      acc = fma(t, dx[k, 4s + h], acc)       (integers exact in any order: |I| < 2**31)
    out[k, r] = acc

`reference_matmul` (interleaved_k_reference.py) is the same arithmetic in numpy. A parallel task takes a run of row
groups (the threads take the tasks of a launch from one queue: numba_runtime.guided_bounds). For each group it
carries up to X_PASS x rows over the super-blocks in turn: a super-block's codes are unpacked once (nibbles split,
Q5_K's and Q6_K's high bits joined) into an L1 scratch, then met by the pass's x rows four at a time (each code
vector loaded once for four rows), the codes of a super-block a few ahead asked for meanwhile (prefetch;
interleaved_k_scratch.py). One to four rows of Q4_K or Q6_K skip the scratch (interleaved_k_single.py: codes split
in registers straight from the packed bytes); Q5_K and wider steps (prefill) take it. Each kind is a kernel of its
own (`_kernel`), so a signature compiles one kind's paths. Launches hold numba_runtime.launch_lock. A decode step's few rows are
quantized inside the launch (x given to the kernel): one dispatch and no allocation in Python (12.5 -> 9.5-10 us a
launch, 73 launches a 1B step).
"""

from __future__ import annotations

from collections.abc import Iterable

import numba
import numpy as np
from numba import njit, prange

from worker.engine.kernels.interleaved_k_scratch import UNPACKED, X_TILE, scratch_pass
from worker.engine.kernels.interleaved_k_single import (
    q4k_super_few,
    q4k_super_single,
    q6k_super_few,
    q6k_super_single,
)
from worker.engine.kernels.k_activations import (
    ACT_BLOCK,
    PARALLEL_QUANTIZE,
    Int8Rows,
    quantize_into,
    quantize_rows,
)
from worker.engine.kernels.numba_runtime import (
    aligned_bytes,
    aligned_floats,
    guided_bounds,
    launch_lock,
    own_cache_index,
    take_next,
)
from worker.engine.kernels.simd_int import KERNEL_CACHE
from worker.engine.kernels.simd_wide import wfload, wfstore
from worker.engine.weights.interleaved_k_blocks import (
    INTERLEAVED_K_KINDS,
    TILE_ROWS,
    InterleavedK,
    interleave_k,
)
from worker.engine.weights.k_blocks import KBlocks, code_bytes
from worker.engine.weights.quant_blocks import QK_K
from worker.engine.weights.read_only import read_only

ROW_CHUNK = 256  # x rows per launch (bounds the int8 copy of x a launch reads)
X_PASS = 64  # x rows a pass carries over a group's super-blocks (their chains, 68 * 16 float32, stay in L1)


@njit(inline="always", cache=KERNEL_CACHE)
def _q4k_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains):  # pragma: no cover (compiled)
    """Carry the chains of x rows x0 .. x0 + n - 1 over Q4_K row group g's super-blocks in turn (matrix: the flat low,
    high, scales, mins, d and dmin; xs: the flat q, S32, -32 S8 and dx (N, C/64)): one to four rows straight from
    the packed bytes, more through the scratch."""
    flat_low, _, flat_scales, flat_mins, flat_d, flat_dmin = matrix
    flat_q, flat_sums, _, dx = xs
    if n == 1:
        for s in range(supers):
            q4k_super_single(flat_low, flat_scales, flat_mins, flat_d, flat_dmin, g * supers + s, flat_q, flat_sums,
                             dx, s, cols, x0, chains)
    elif n <= X_TILE:
        for s in range(supers):
            q4k_super_few(flat_low, flat_scales, flat_mins, flat_d, flat_dmin, g * supers + s, flat_q, flat_sums, dx,
                          s, cols, x0, n, chains)
    else:
        scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 4, False)


@njit(inline="always", cache=KERNEL_CACHE)
def _q6k_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains):  # pragma: no cover (compiled)
    """_q4k_pass's, for Q6_K."""
    flat_low, flat_high, flat_scales, _, flat_d, _ = matrix
    flat_q, _, flat_offsets, dx = xs
    if n == 1:
        for s in range(supers):
            q6k_super_single(flat_low, flat_high, flat_scales, flat_d, g * supers + s, flat_q, flat_offsets, dx, s,
                             cols, x0, chains)
    elif n <= X_TILE:
        for s in range(supers):
            q6k_super_few(flat_low, flat_high, flat_scales, flat_d, g * supers + s, flat_q, flat_offsets, dx, s, cols,
                          x0, n, chains)
    else:
        scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 6, False)


@njit(inline="always", cache=KERNEL_CACHE)
def _q5k_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains):  # pragma: no cover (compiled)
    """_q4k_pass's, for Q5_K: every width through the scratch (one row with the other three rows' work left out)."""
    if n == 1:
        scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 5, True)
    else:
        scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 5, False)


def _kernel(bits: int):  # type: ignore[no-untyped-def]
    """The launch of one kind, `bits` (4, 5 or 6: Q4_K, Q5_K, Q6_K) a constant of the closure: numba prunes the other
    kinds' branches before it inlines their paths, so each kernel compiles its own kind's only (with `bits` read from
    the arrays, every signature compiled all three: ~50 s a signature cold on an AMD EPYC). A closure holding only an
    int has the same numba cache key in every process (float_matmul.py); each kind keeps its own cache index
    (numba_runtime.own_cache_index)."""

    @njit(parallel=True, nogil=True, cache=KERNEL_CACHE)
    @own_cache_index(f"q{bits}k")
    def matmul(low, high, scales, mins, d, dmin, x, q, dx, sums32, offsets, parts, starts, span, out,
               threads):  # pragma: no cover (compiled)
        """out[k, :16 span] for x rows starts[i] .. starts[i + 1] - 1 against the `span` row groups from
        parts[i] * span on (a dense matrix: one part, 0; stacked experts: each used expert's rows), the module
        docstring's reduction. Tasks take runs of (part, group) items from a queue the `threads` share. x (N, C)
        float32, where it has rows (a decode step's few), is quantized here, in this thread, in place of the q, dx,
        S32 and -32 S8 given (quantize_rows'; then empty)."""
        if x.shape[0] > 0:
            q = np.empty(x.shape, np.int8)  # (N, C)
            dx = np.empty((x.shape[0], x.shape[1] // ACT_BLOCK), np.float32)  # (N, C/64)
            sums32 = np.empty((x.shape[0], x.shape[1] // 32), np.int16)  # (N, C/32)
            offsets = np.empty((x.shape[0], x.shape[1] // 8), np.int32)  # (N, C/8)
            quantize_into(x, q, dx, sums32, offsets)
        supers = low.shape[1]
        cols = q.shape[1]
        width = out.shape[1]
        flat_low, flat_high, flat_scales = low.reshape(-1), high.reshape(-1), scales.reshape(-1)  # (bytes,) each
        flat_mins, flat_d, flat_dmin = mins.reshape(-1), d.reshape(-1), dmin.reshape(-1)  # (G S 16,) d, dmin
        flat_q, flat_sums, flat_offsets = q.reshape(-1), sums32.reshape(-1), offsets.reshape(-1)  # (N C,) ..
        flat_out = out.reshape(-1)  # (N 16 span,)
        bounds = guided_bounds(len(parts) * span, threads)  # (tasks + 1,)
        queue = np.zeros(1, np.int64)  # the next task not taken
        for _ in prange(min(threads, len(bounds) - 1)):
            scratch = aligned_bytes(UNPACKED)  # (4096,) a super-block's codes, one a byte
            chains = aligned_floats((X_PASS + X_TILE) * TILE_ROWS)  # (68 * 16,) slots past n are spares
            task = take_next(queue)
            while task < len(bounds) - 1:
                for item in range(bounds[task], bounds[task + 1]):
                    part, local = item // span, item % span
                    g = parts[part] * span + local
                    for x0 in range(starts[part], starts[part + 1], X_PASS):
                        n = min(X_PASS, starts[part + 1] - x0)
                        chains[: (n + X_TILE) * TILE_ROWS] = 0  # the pass's rows and a short tile's spares (not 68)
                        matrix = (flat_low, flat_high, flat_scales, flat_mins, flat_d, flat_dmin)
                        xs = (flat_q, flat_sums, flat_offsets, dx)
                        if bits == 4:
                            _q4k_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains)
                        elif bits == 5:
                            _q5k_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains)
                        else:
                            _q6k_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains)
                        for i in range(n):
                            wfstore(flat_out, (x0 + i) * width + local * TILE_ROWS, wfload(chains, i * TILE_ROWS))
                task = take_next(queue)

    return matmul


_KERNELS = {"Q4_K": _kernel(4), "Q5_K": _kernel(5), "Q6_K": _kernel(6)}


_EMPTY_BYTES = read_only(np.zeros((0, 0, 0, 0), np.uint8))  # read-only, as the matrices' arrays (read_only.py)
_EMPTY_SCALES = tuple(read_only(np.zeros((0, 0, 0), t)) for t in (np.float32, np.uint16))  # Q6_K's dmin, d's dtype


def interleaved_k_matmul(x: np.ndarray, blocks: InterleavedK) -> np.ndarray:
    """x (N, C) times the interleaved Q4_K, Q5_K or Q6_K matrix (R, C) transposed: (N, R), row-major."""
    n_rows, cols = x.shape
    if blocks.shape[1] != cols:
        raise ValueError(f"{blocks.kind} matrix {blocks.shape} does not fit x {x.shape}")
    groups = blocks.low.shape[0]
    out = np.empty((n_rows, groups * TILE_ROWS), np.float32)  # (N, 16 G)
    if n_rows * cols < PARALLEL_QUANTIZE:  # a few rows (decode): quantized inside the launch
        x = np.ascontiguousarray(x, np.float32)
        _launch(blocks, x if x.flags.writeable else x.copy(), _NO_ROWS, _DENSE, _STARTS[n_rows], groups, out)
    else:
        rows = quantize_rows(x)
        for first in range(0, n_rows, ROW_CHUNK):
            _launch(blocks, _NO_X, rows, _DENSE, np.array([first, min(n_rows, first + ROW_CHUNK)], np.int64), groups,
                    out)
    return out if groups * TILE_ROWS == blocks.out else np.ascontiguousarray(out[:, : blocks.out])  # (N, R)


def interleaved_k_grouped(rows: Int8Rows, blocks: InterleavedK, parts: np.ndarray, starts: np.ndarray,
                          part_rows: int) -> np.ndarray:
    """Stacked experts: x rows starts[i] .. starts[i + 1] - 1 (quantized) times the (part_rows, C) block of rows
    from parts[i] * part_rows on, transposed, each expert's codes read once for all of its rows: (P, part_rows)."""
    if part_rows % TILE_ROWS:
        raise ValueError(f"experts of {part_rows} rows are not whole groups of {TILE_ROWS}")
    out = np.empty((rows.q.shape[0], part_rows), np.float32)  # (P, part_rows)
    _launch(blocks, _NO_X, rows, np.ascontiguousarray(parts, np.int64), np.ascontiguousarray(starts, np.int64),
            part_rows // TILE_ROWS, out)
    return out


_DENSE = np.zeros(1, np.int64)  # a dense matrix is one part: rows from 0
_STARTS = [np.array([0, n], np.int64) for n in range(PARALLEL_QUANTIZE // QK_K)]  # x rows 0 .. n - 1 of one part
_NO_X = np.zeros((0, 0), np.float32)  # x given quantized
_NO_ROWS = Int8Rows(np.zeros((0, 0), np.int8), *(np.zeros((0, 0), t) for t in (np.float32, np.int16, np.int32)))


def _optional_arrays(blocks: InterleavedK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """high, mins and dmin, an empty array of the kernel's type for each one the kind lacks."""
    empty_dmin = _EMPTY_SCALES[blocks.d.dtype == np.uint16]
    return (_EMPTY_BYTES if blocks.high is None else blocks.high, _EMPTY_BYTES if blocks.mins is None else blocks.mins,
            empty_dmin if blocks.dmin is None else blocks.dmin)


def _launch(blocks: InterleavedK, x: np.ndarray, rows: Int8Rows, parts: np.ndarray, starts: np.ndarray, span: int,
            out: np.ndarray) -> None:
    """One kernel launch (under the launch lock) writing out's rows starts[0] .. starts[-1] - 1, from x (a decode
    step's few rows, quantized in the launch) or else from its rows quantized."""
    high, mins, dmin = _optional_arrays(blocks)
    with launch_lock:
        _KERNELS[blocks.kind](blocks.low, high, blocks.scales, mins, blocks.d, dmin, x, rows.q, rows.dx, rows.sums32,
                              rows.offsets, parts, starts, span, out, numba.get_num_threads())


def warm(matrices: Iterable[object] | None = None) -> None:
    """Compile (or load from numba's cache) the kernel of each kind and d dtype among the K-quant `matrices` (every
    one when None: an image's build), with x both ways: a decode step's few rows quantized in the launch, a prefill's
    many before it (a matrix's arrays are read-only however it was made)."""
    if matrices is None:
        forms = {(k, half) for k in INTERLEAVED_K_KINDS for half in (True, False)}
    else:
        forms = {(m.kind, m.d.dtype == np.uint16) for m in matrices if isinstance(m, InterleavedK)}
    rng = np.random.default_rng(0)
    for kind, half in sorted(forms):
        low, high = code_bytes(np.zeros((TILE_ROWS, QK_K), np.uint8), kind)  # (16, 128), high bits or None
        supers = np.full((TILE_ROWS, 1), 0.0 if half else 0.1, np.float32)  # (16, 1): 0.1 is no float16
        if kind == "Q6_K":
            blocks = KBlocks(kind, low, np.zeros((TILE_ROWS, 16), np.int8), supers, high=high)
        else:
            blocks = KBlocks(kind, low, np.zeros((TILE_ROWS, 8), np.uint8), supers, high=high,
                             mins=np.zeros((TILE_ROWS, 8), np.uint8), dmin=supers)
        matrix = interleave_k(blocks)
        for rows in (1, PARALLEL_QUANTIZE // QK_K):  # quantized in the launch, then by quantize_rows
            interleaved_k_matmul(rng.standard_normal((rows, QK_K)).astype(np.float32), matrix)
