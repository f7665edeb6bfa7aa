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
vector loaded once for four rows), the codes of a super-block a few ahead asked for meanwhile (prefetch). One to four
rows of Q4_K or Q6_K skip the scratch (interleaved_k_single.py: codes split in registers straight from the packed
bytes); Q5_K and wider steps (prefill) take it. Launches hold numba_runtime.launch_lock. A decode step's few rows are
quantized inside the launch (x given to `_matmul`): one dispatch and no allocation in Python (12.5 -> 9.5-10 us a
launch, 73 launches a 1B step).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from worker.engine.kernels.interleaved_k_single import (
    carry,
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
    take_next,
)
from worker.engine.kernels.simd_int import KERNEL_CACHE, prefetch_run
from worker.engine.kernels.simd_scales import wload_scales
from worker.engine.kernels.simd_wide import (
    wdot4,
    wdot_words,
    wfbroadcast,
    wfload,
    wfloat,
    wfma,
    wfmul,
    wfstore,
    wfzero,
    whigh4,
    wload_codes,
    wload_widened,
    wload_word_pairs,
    wlow4,
    wlow_words,
    wmadd_words,
    wpair_splat,
    wquad_splat,
    wsplat_at,
    wstore_codes,
    wtop_bits,
    wzero,
)
from worker.engine.weights.interleaved_k_blocks import (
    INTERLEAVED_K_KINDS,
    TILE_ROWS,
    VECTOR_BYTES,
    InterleavedK,
    interleave_k,
)
from worker.engine.weights.k_blocks import KBlocks, code_bytes
from worker.engine.weights.quant_blocks import QK_K
from worker.engine.weights.read_only import read_only

ROW_CHUNK = 256  # x rows per launch (bounds the int8 copy of x a launch reads)
X_PASS = 64  # x rows a pass carries over a group's super-blocks (their chains, 68 * 16 float32, stay in L1)
X_TILE = 4  # x rows met by each code vector load
PREFETCH_SUPERS = 4  # super-blocks ahead whose codes the scratch path asks for
UNPACKED = 64 * VECTOR_BYTES  # bytes of one super-block's codes of sixteen rows, one a byte


@njit(inline="always", cache=KERNEL_CACHE)
def _unpack(flat_low, flat_high, table, scratch, bits):  # pragma: no cover (compiled)
    """Super-block `table`'s codes, one a byte, into scratch: vector 8j + c holds columns 32j + 4c .. 32j + 4c + 3
    (c < 8) of each row, from the file's bytes (k_blocks.py): byte i of a Q4_K or Q5_K part p holds columns 64p + i
    and 64p + 32 + i, of a Q6_K quarter q = 2t + m columns 128t + 32m + i and 128t + 64 + 32m + i, in its low and
    high nibbles; Q5_K's fifth-bit byte i holds column 32j + i in bit j, Q6_K's byte 32t + i columns 128t + 32k + i
    in bits 2k, 2k + 1. `bits` (a constant): 4, 5 or 6."""
    for v in range(32):
        packed = wload_codes(flat_low, (table * 32 + v) * VECTOR_BYTES)  # (64,) code bytes 4v .. 4v + 3
        low, high = wlow4(packed), whigh4(packed)  # (64,) each
        quarter, c = v // 8, v % 8
        first = 4 * (quarter // 2) + quarter % 2 if bits == 6 else 2 * quarter  # the low nibbles' block
        second = first + 2 if bits == 6 else first + 1  # the high nibbles' block
        if bits == 5:
            fifth = wload_codes(flat_high, (table * 8 + c) * VECTOR_BYTES)  # (64,)
            low, high = wtop_bits(low, fifth, first, 1), wtop_bits(high, fifth, second, 1)
        elif bits == 6:
            top = wload_codes(flat_high, (table * 16 + 8 * (first // 4) + c) * VECTOR_BYTES)  # (64,)
            low, high = wtop_bits(low, top, 2 * (first % 4), 3), wtop_bits(high, top, 2 * (second % 4), 3)
        wstore_codes(scratch, (8 * first + c) * VECTOR_BYTES, low)
        wstore_codes(scratch, (8 * second + c) * VECTOR_BYTES, high)


@njit(inline="always", cache=KERNEL_CACHE)
def _products(scratch, at, flat_q, a0, a1, a2, a3, v0, v1, v2, v3, first, count):  # pragma: no cover (compiled)
    """v_i + (lane r: the products of row r's codes in scratch vectors first .. first + count - 1 from `at` (four
    columns each) and x row i's activations from flat_q[a_i]) for four x rows."""
    for c in range(first, first + count):
        code = wload_codes(scratch, at + c * VECTOR_BYTES)  # (64,)
        v0 = wdot4(v0, code, wquad_splat(flat_q, a0 + 4 * c))  # (16,)
        v1 = wdot4(v1, code, wquad_splat(flat_q, a1 + 4 * c))  # (16,)
        v2 = wdot4(v2, code, wquad_splat(flat_q, a2 + 4 * c))  # (16,)
        v3 = wdot4(v3, code, wquad_splat(flat_q, a3 + 4 * c))  # (16,)
    return v0, v1, v2, v3


@njit(inline="always", cache=KERNEL_CACHE)
def _q45k_quarter(scratch, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0, a1, a2, a3, m0, m1, m2, m3,
                  fifth):  # pragma: no cover (compiled)
    """I and M of quarter h (the module docstring's) for four x rows (activations from a_i, S32 pairs at m_i). `fifth`
    (a constant): Q5_K's codes, below 32, take the sub-scale every 8 columns (8 * 31 * 127 < 32768), Q4_K's every 16."""
    i0, i1, i2, i3 = wzero(), wzero(), wzero(), wzero()  # (16,) int32 each
    for b in range(2):
        j = 2 * h + b
        sub = wload_widened(flat_scales, (table * 8 + j) * TILE_ROWS)  # (16,) block j's sub-scale of each row
        for t in range(2):
            at, col = (8 * j + 4 * t) * VECTOR_BYTES, 32 * j + 16 * t
            for first in range(0, 4, 2 if fifth else 4):
                zero = wzero()
                v0, v1, v2, v3 = _products(scratch, at, flat_q, a0 + col, a1 + col, a2 + col, a3 + col, zero, zero,
                                           zero, zero, first, 2 if fifth else 4)  # (16,) int32 each
                i0, i1 = wdot_words(i0, v0, sub), wdot_words(i1, v1, sub)
                i2, i3 = wdot_words(i2, v2, sub), wdot_words(i3, v3, sub)
    mins = wload_word_pairs(flat_mins, (table * 4 + h) * 2 * TILE_ROWS)  # (16,) the quarter's two mins of each row
    n0 = wmadd_words(mins, wpair_splat(flat_sums, m0 + 2 * h))  # (16,) int32: M of x row 0
    n1 = wmadd_words(mins, wpair_splat(flat_sums, m1 + 2 * h))
    n2 = wmadd_words(mins, wpair_splat(flat_sums, m2 + 2 * h))
    n3 = wmadd_words(mins, wpair_splat(flat_sums, m3 + 2 * h))
    return i0, i1, i2, i3, n0, n1, n2, n3  # (16,) int32 each


@njit(inline="always", cache=KERNEL_CACHE)
def _q6k_quarter(scratch, flat_scales, table, h, flat_q, flat_offsets, a0, a1, a2, a3, o0, o1, o2,
                 o3):  # pragma: no cover (compiled)
    """I of quarter h (the module docstring's) for four x rows (activations from a_i, -32 S8 from o_i): each group's
    two runs of 8 columns start from -32 S8, so their sums of (code - 32) * q stay within 8 * 32 * 127 < 32768 and
    vpdpwssd applies the signed sub-scale (its high word cleared)."""
    i0, i1, i2, i3 = wzero(), wzero(), wzero(), wzero()  # (16,) int32 each
    for g in range(4 * h, 4 * h + 4):
        sub = wlow_words(wload_widened(flat_scales, (table * 16 + g) * TILE_ROWS))  # (16,) group g's sub-scale
        at, col = 4 * g * VECTOR_BYTES, 16 * g
        for e in range(2):
            run = 2 * g + e
            v0, v1, v2, v3 = _products(scratch, at, flat_q, a0 + col, a1 + col, a2 + col, a3 + col,
                                       wsplat_at(flat_offsets, o0 + run), wsplat_at(flat_offsets, o1 + run),
                                       wsplat_at(flat_offsets, o2 + run), wsplat_at(flat_offsets, o3 + run), 2 * e,
                                       2)  # (16,) int32 each
            i0, i1 = wdot_words(i0, v0, sub), wdot_words(i1, v1, sub)
            i2, i3 = wdot_words(i2, v2, sub), wdot_words(i3, v3, sub)
    return i0, i1, i2, i3


@njit(inline="always", cache=KERNEL_CACHE)
def _super(scratch, flat_scales, flat_mins, flat_d, flat_dmin, table, flat_q, flat_sums, flat_offsets, dx, s, cols,
           x0, n, chains, bits, single):  # pragma: no cover (compiled)
    """Carry the chains of x rows x0 .. x0 + n - 1 over super-block s (its codes unpacked in scratch; its tables at
    `table`), four x rows at a time (a short last tile repeats its last row into spare chains). Constants: `bits`,
    the codes' (4, 5 or 6: Q4_K, Q5_K, Q6_K); `single`, n is 1."""
    six = bits == 6
    d = wload_scales(flat_d, table * TILE_ROWS)  # (16,)
    negative = wfzero() if six else wfmul(wload_scales(flat_dmin, table * TILE_ROWS), wfbroadcast(np.float32(-1.0)))
    for i in range(0, n, X_TILE):
        k0, k1 = x0 + i, x0 + min(i + 1, n - 1)
        k2, k3 = x0 + min(i + 2, n - 1), x0 + min(i + 3, n - 1)
        a0, a1, a2, a3 = k0 * cols + s * QK_K, k1 * cols + s * QK_K, k2 * cols + s * QK_K, k3 * cols + s * QK_K
        for h in range(4):
            column = 4 * s + h
            if six:
                o = cols // 8
                i0, i1, i2, i3 = _q6k_quarter(scratch, flat_scales, table, h, flat_q, flat_offsets, a0, a1, a2, a3,
                                              k0 * o + 32 * s, k1 * o + 32 * s, k2 * o + 32 * s, k3 * o + 32 * s)
                t0, t1, t2, t3 = wfmul(wfloat(i0), d), wfmul(wfloat(i1), d), wfmul(wfloat(i2), d), wfmul(wfloat(i3), d)
            else:
                m = cols // 32
                i0, i1, i2, i3, n0, n1, n2, n3 = _q45k_quarter(
                    scratch, flat_scales, flat_mins, table, h, flat_q, flat_sums, a0, a1, a2, a3, k0 * m + 8 * s,
                    k1 * m + 8 * s, k2 * m + 8 * s, k3 * m + 8 * s, bits == 5)
                t0 = wfma(wfloat(n0), negative, wfmul(wfloat(i0), d))  # (16,)
                t1 = wfma(wfloat(n1), negative, wfmul(wfloat(i1), d))
                t2 = wfma(wfloat(n2), negative, wfmul(wfloat(i2), d))
                t3 = wfma(wfloat(n3), negative, wfmul(wfloat(i3), d))
            carry(chains, i, t0, dx[k0, column])
            if not single:  # (a constant: with one x row the other three rows' work is dead code)
                carry(chains, i + 1, t1, dx[k1, column])
                carry(chains, i + 2, t2, dx[k2, column])
                carry(chains, i + 3, t3, dx[k3, column])


@njit(inline="always", cache=KERNEL_CACHE)
def _prefetch_codes(flat_low, flat_high, table, bits):  # pragma: no cover (compiled)
    """Ask for super-block `table`'s code bytes (its sixteen rows' low bits, and Q5_K's or Q6_K's high bits) a
    few super-blocks before they are unpacked. With five or more x rows the unpacking and products leave the
    hardware prefetcher behind: asking 4 super-blocks ahead made a 16-row decode step 8% shorter (Xeon; the 1B and
    the Qwen3-4B twin), and changed neither 64 rows nor prefill. On the one- to four-row paths (interleaved_k_single,
    bound by memory) it made steps 12-17% longer, so they do not ask."""
    prefetch_run(flat_low, table * 32 * VECTOR_BYTES, 32 * VECTOR_BYTES)
    if bits != 4:
        planes = 8 if bits == 5 else 16  # vectors of high bits a super-block holds
        prefetch_run(flat_high, table * planes * VECTOR_BYTES, planes * VECTOR_BYTES)


@njit(inline="always", cache=KERNEL_CACHE)
def _scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, bits, single):  # pragma: no cover (compiled)
    """The general path: each of row group g's super-blocks unpacked once into scratch, then met by x rows
    x0 .. x0 + n - 1. Constants: `bits` (4, 5 or 6) and `single` (n is 1)."""
    flat_low, flat_high, flat_scales, flat_mins, flat_d, flat_dmin = matrix
    flat_q, flat_sums, flat_offsets, dx = xs
    for s in range(supers):
        table = g * supers + s
        if not single:  # (a constant) one row is bound by memory, where asking ahead measured slower (Q4_K, Q6_K)
            _prefetch_codes(flat_low, flat_high, table + PREFETCH_SUPERS, bits)
        _unpack(flat_low, flat_high, table, scratch, bits)
        _super(scratch, flat_scales, flat_mins, flat_d, flat_dmin, table, flat_q, flat_sums, flat_offsets, dx, s,
               cols, x0, n, chains, bits, single)


@njit(inline="always", cache=KERNEL_CACHE)
def _group_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, bits):  # pragma: no cover (compiled)
    """Carry the chains of x rows x0 .. x0 + n - 1 over row group g's super-blocks in turn (matrix: the flat low,
    high, scales, mins, d and dmin; xs: the flat q, S32, -32 S8 and dx (N, C/64)). Each path is written once: numba
    inlines a copy of a callee at each call (a cold compile took 135 s on a Xeon when every path sat under each of
    three `bits` constants, ~4x the code)."""
    flat_low, flat_high, flat_scales, flat_mins, flat_d, flat_dmin = matrix
    flat_q, flat_sums, flat_offsets, dx = xs
    if bits == 4 and n == 1:  # one row of Q4_K or Q6_K: straight from the packed bytes
        for s in range(supers):
            q4k_super_single(flat_low, flat_scales, flat_mins, flat_d, flat_dmin, g * supers + s, flat_q, flat_sums,
                              dx, s, cols, x0, chains)
    elif bits == 6 and n == 1:
        for s in range(supers):
            q6k_super_single(flat_low, flat_high, flat_scales, flat_d, g * supers + s, flat_q, flat_offsets, dx, s,
                              cols, x0, chains)
    elif bits == 4 and n <= X_TILE:  # two to four rows of Q4_K or Q6_K: from the packed bytes too
        for s in range(supers):
            q4k_super_few(flat_low, flat_scales, flat_mins, flat_d, flat_dmin, g * supers + s, flat_q, flat_sums, dx,
                          s, cols, x0, n, chains)
    elif bits == 6 and n <= X_TILE:
        for s in range(supers):
            q6k_super_few(flat_low, flat_high, flat_scales, flat_d, g * supers + s, flat_q, flat_offsets, dx, s, cols,
                          x0, n, chains)
    elif bits == 4:  # (each call compiles its own constants)
        _scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 4, False)
    elif bits == 6:
        _scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 6, False)
    elif n == 1:
        _scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 5, True)
    else:
        _scratch_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, 5, False)


@njit(parallel=True, nogil=True, cache=KERNEL_CACHE)
def _matmul(low, high, scales, mins, d, dmin, x, q, dx, sums32, offsets, parts, starts, span, out,
            threads):  # pragma: no cover
    """out[k, :16 span] for x rows starts[i] .. starts[i + 1] - 1 against the `span` row groups from
    parts[i] * span on (a dense matrix: one part, 0; stacked experts: each used expert's rows), the module
    docstring's reduction. Tasks take runs of (part, group) items from a queue the `threads` share. x (N, C)
    float32, where it has rows (a decode step's few), is quantized here, in this thread, in place of the q, dx, S32
    and -32 S8 given (quantize_rows'; then empty)."""
    if x.shape[0] > 0:
        q = np.empty(x.shape, np.int8)  # (N, C)
        dx = np.empty((x.shape[0], x.shape[1] // ACT_BLOCK), np.float32)  # (N, C/64)
        sums32 = np.empty((x.shape[0], x.shape[1] // 32), np.int16)  # (N, C/32)
        offsets = np.empty((x.shape[0], x.shape[1] // 8), np.int32)  # (N, C/8)
        quantize_into(x, q, dx, sums32, offsets)
    supers = low.shape[1]
    cols = q.shape[1]
    width = out.shape[1]
    bits = 4 if high.size == 0 else 5 if high.shape[2] == 8 else 6  # Q4_K, Q5_K (8 bit planes) or Q6_K (16)
    flat_low, flat_high, flat_scales = low.reshape(-1), high.reshape(-1), scales.reshape(-1)
    flat_mins, flat_d, flat_dmin = mins.reshape(-1), d.reshape(-1), dmin.reshape(-1)
    flat_q, flat_sums, flat_offsets, flat_out = q.reshape(-1), sums32.reshape(-1), offsets.reshape(-1), out.reshape(-1)
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
                    _group_pass(matrix, xs, g, supers, cols, x0, n, scratch, chains, bits)
                    for i in range(n):
                        wfstore(flat_out, (x0 + i) * width + local * TILE_ROWS, wfload(chains, i * TILE_ROWS))
            task = take_next(queue)


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
        _matmul(blocks.low, high, blocks.scales, mins, blocks.d, dmin, x, rows.q, rows.dx, rows.sums32, rows.offsets,
                parts, starts, span, out, numba.get_num_threads())


def warm() -> None:
    """Compile (or load from numba's cache) the kernel, once for every kind and scale dtype (a matrix's arrays are
    read-only however it was made), with x both ways: a decode step's few rows quantized in the launch, a prefill's
    many before it."""
    rng = np.random.default_rng(0)
    for kind, scale in [(k, s) for k in INTERLEAVED_K_KINDS for s in (0.0, 0.1)]:  # 0.1 is no float16: float32 d
        low, high = code_bytes(np.zeros((TILE_ROWS, QK_K), np.uint8), kind)  # (16, 128), high bits or None
        supers = np.full((TILE_ROWS, 1), scale, np.float32)  # (16, 1)
        if kind == "Q6_K":
            blocks = KBlocks(kind, low, np.zeros((TILE_ROWS, 16), np.int8), supers, high=high)
        else:
            blocks = KBlocks(kind, low, np.zeros((TILE_ROWS, 8), np.uint8), supers, high=high,
                             mins=np.zeros((TILE_ROWS, 8), np.uint8), dmin=supers)
        matrix = interleave_k(blocks)
        for rows in (1, PARALLEL_QUANTIZE // QK_K):  # quantized in the launch, then by quantize_rows
            interleaved_k_matmul(rng.standard_normal((rows, QK_K)).astype(np.float32), matrix)
