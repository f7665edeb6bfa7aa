"""Compiled CPU kernels (numba) for the per-row steps of a layer whose numpy passes cost more than their arithmetic:
the KV row store and RoPE (both bit for bit numpy's) and RMS normalisation (one fixed order per row), each in one
thread with no launch; and SwiGLU across the kernel threads (numpy's four single-threaded passes left the second
core idle) but for a decode step's row or two. Paged attention is paged_attention.py; the matmuls are
float_matmul.py, interleaved_k_matmul.py, interleaved_matmul.py and mxfp4_matmul.py; the threading set-up and launch
lock all use are numba_runtime.py's.

Parallel kernels prefer numba's OpenMP layer: on the 2-core machine the `workqueue` layer launched the block
matmul at half the speed (15-24 ms against 10 ms for SmolLM2's matrices). Where OpenMP is missing numba falls
back to workqueue. Launches go through a process-wide lock, because workqueue must not be entered by two threads
at once. OpenMP is not fork-safe: the engine runs in processes started by exec, never forked after a launch.
OpenMP's idle threads spin before they sleep: numba_runtime.set_spin keeps libgomp's default for a decoder and cuts
it to 10,000 rounds where OpenBLAS's threads share the step (an encoder), whose cores the spin would take.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numba import njit, prange

from worker.engine.kernels.numba_runtime import launch_lock
from worker.engine.kernels.paged_attention import paged_attend_decode
from worker.engine.kernels.simd import (
    LANES,
    narrow,
    vadd,
    vbroadcast,
    vdiv,
    vexp,
    vfma,
    vload,
    vmul,
    vstore,
    vsub,
    vsum,
    vzero,
)


@njit(nogil=True, cache=True)
def _store_halves(rows, arena, blocks, offsets):  # pragma: no cover (compiled)
    """Block blocks[n]'s row offsets[n] of head h = rows[n, h] as float16 bits (rows (N, Hkv, Dh) float32, any
    strides; arena (NG, Hkv, G, BS, Dh) uint16)."""
    per_group = arena.shape[2]
    for n in range(rows.shape[0]):
        block, offset = blocks[n], offsets[n]
        for h in range(rows.shape[1]):
            for d in range(rows.shape[2]):
                arena[block // per_group, h, block % per_group, offset, d] = narrow(rows[n, h, d])


def store_rows(arena: np.ndarray, blocks: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> None:
    """Keys or values rows (N, Hkv, Dh) into one layer's arena (NG, Hkv, G, BS, Dh) at (blocks, offsets) (N,) each:
    float32 rows into a float16 arena by a compiled loop (numpy's rounding, without its scatter's transposed copy:
    about 3x faster at 16 rows), anything else by numpy."""
    if arena.dtype == np.float16 and rows.dtype == np.float32:
        _store_halves(rows, arena.view(np.uint16), blocks, offsets)
    else:
        per_group = arena.shape[2]
        arena[blocks // per_group, :, blocks % per_group, offsets] = rows  # (N, Hkv, Dh)


@njit(nogil=True, cache=True)
def _rotate(x, cos, sin, half):  # pragma: no cover (compiled)
    """Features i and half + i (i < half) of every head of x (N, H, Dh), any strides, rotated in place by the angle
    whose cosine and sine are cos, sin[n, 0, i]: each new value two products and a sum, rounded as numpy's passes
    round them (no fused multiply-add)."""
    for n in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                first, second = x[n, h, i], x[n, h, half + i]
                c, s = cos[n, 0, i], sin[n, 0, i]
                x[n, h, i] = first * c - second * s
                x[n, h, half + i] = second * c + first * s


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope_dim: int) -> None:
    """Rotary embedding of the first rope_dim features of every head of x (N, H, Dh) float32, in place, in half-
    rotation (NEOX) form; cos, sin (N, 1, rope_dim / 2) float32. Bit for bit RotaryTable's numpy passes, about 3x
    faster at 16 rows."""
    _rotate(x, cos, sin, rope_dim // 2)


@njit(nogil=True, cache=True)
def _rms_rows(x, eps, out):  # pragma: no cover (compiled)
    """out[n] = x[n] / sqrt(mean of x[n]'s squares + eps) for x, out (N, D) row-major float32: the squares summed in
    two eight-lane chains (fused multiply-adds, lane i of chain j taking columns 16c + 8j + i in order), the chains
    and lanes added in one fixed order, the tail in order after them; whatever the rows around it."""
    n_rows, width = x.shape
    whole = width // (2 * LANES) * (2 * LANES)
    flat, flat_out = x.reshape(-1), out.reshape(-1)  # (N*D,) each
    inverse_width = np.float32(1.0 / width)
    for n in range(n_rows):
        at = n * width
        first, second = vzero(), vzero()  # (8,) each
        for c in range(at, at + whole, 2 * LANES):
            a, b = vload(flat, c), vload(flat, c + LANES)  # (8,) each
            first, second = vfma(a, a, first), vfma(b, b, second)  # (8,) each
        total = vsum(vadd(first, second))
        for c in range(at + whole, at + width):
            total += flat[c] * flat[c]
        scale = np.float32(math.sqrt(total * inverse_width + eps))
        divisor = vbroadcast(scale)  # (8,)
        for c in range(at, at + width - width % LANES, LANES):
            vstore(flat_out, c, vdiv(vload(flat, c), divisor))  # (8,): each quotient rounded once, as a scalar's
        for c in range(at + width - width % LANES, at + width):
            flat_out[c] = flat[c] / scale


def rms_rows(x: np.ndarray, eps: float) -> np.ndarray:
    """Every row of x (N, D) float32 divided by its root mean square (+ eps), each row in one fixed order whatever
    the step holds (batch invariance): (N, D), a new array."""
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)  # (N, D)
    _rms_rows(x, np.float32(eps), out)
    return out


SWIGLU_CHUNK = 256  # columns per task of the SwiGLU kernel
SERIAL_SWIGLU = 16384  # outputs up to which SwiGLU runs in the calling thread (a launch costs more than a 1B row)


@njit(inline="always", cache=True, fastmath=True)
def _swiglu_task(flat, flat_out, task, per_row, f):  # pragma: no cover (compiled)
    """SWIGLU_CHUNK columns of one row: the chunk `task` of a (N, 2F) gate/up flattened, into the (N, F) out."""
    k = task // per_row
    first = (task % per_row) * SWIGLU_CHUNK
    last = min(f, first + SWIGLU_CHUNK)
    whole = first + (last - first) // LANES * LANES
    one = vbroadcast(np.float32(1.0))  # (8,)
    for c in range(first, whole, LANES):
        g = vload(flat, k * 2 * f + c)  # (8,) gate
        silu = vdiv(g, vadd(one, vexp(vsub(vzero(), g))))  # (8,)
        vstore(flat_out, k * f + c, vmul(silu, vload(flat, k * 2 * f + f + c)))
    if whole < last:  # the last few columns through the same vector arithmetic, from zero-padded lanes (a scalar
        # tail compiled apart gave a last bit that differed between the threaded and the in-thread kernel)
        lanes = np.zeros(3 * LANES, np.float32)  # (24,) gate, up, result
        for c in range(whole, last):
            lanes[c - whole], lanes[LANES + c - whole] = flat[k * 2 * f + c], flat[k * 2 * f + f + c]
        g = vload(lanes, 0)  # (8,)
        vstore(lanes, 2 * LANES, vmul(vdiv(g, vadd(one, vexp(vsub(vzero(), g)))), vload(lanes, LANES)))
        for c in range(whole, last):
            flat_out[k * f + c] = lanes[2 * LANES + c - whole]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _swiglu(gate_up, out):  # pragma: no cover (compiled)
    """out[k, c] = SiLU(gate_up[k, c]) * gate_up[k, F + c], in chunks of SWIGLU_CHUNK columns across threads."""
    f = gate_up.shape[1] // 2  # gate_up (N, 2F); out (N, F)
    per_row = (f + SWIGLU_CHUNK - 1) // SWIGLU_CHUNK
    for task in prange(gate_up.shape[0] * per_row):
        _swiglu_task(gate_up.reshape(-1), out.reshape(-1), task, per_row, f)


@njit(nogil=True, fastmath=True, cache=True)
def _swiglu_here(gate_up, out):  # pragma: no cover (compiled)
    """_swiglu's chunks in turn, in the calling thread: the same arithmetic for every element."""
    f = gate_up.shape[1] // 2  # gate_up (N, 2F); out (N, F)
    per_row = (f + SWIGLU_CHUNK - 1) // SWIGLU_CHUNK
    for task in range(gate_up.shape[0] * per_row):
        _swiglu_task(gate_up.reshape(-1), out.reshape(-1), task, per_row, f)


def swiglu(gate_up: np.ndarray) -> np.ndarray:
    """SiLU(gate) * up for a row-major fused (N, 2F) float32 gate/up projection: (N, F). Up to SERIAL_SWIGLU outputs
    (a decode step of one or two rows) in this thread, where a launch would cost more than the arithmetic (3.7
    against 5.3 us for a 1B row); more on every kernel thread. Each element's arithmetic is the same either way."""
    out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), np.float32)  # (N, F)
    if out.size <= SERIAL_SWIGLU:
        _swiglu_here(gate_up, out)
    else:
        with launch_lock:
            _swiglu(gate_up, out)
    return out


def warm_up() -> None:
    """Compile every kernel into numba's cache (an image build runs this so that workers start without it)."""
    for head_dim, dtype in itertools.product((8, 4 * LANES), (np.float16, np.float32)):  # scalar and vector kernels
        keys = np.zeros((2, 1, 1, 4, head_dim), dtype)  # (NG, Hkv, G, BS, Dh)
        paged_attend_decode(np.zeros((1, 2, head_dim), np.float32), keys, keys, np.ones((1, 1), np.int64),
                            np.ones(1, np.int64), np.zeros(1, np.int64))
    swiglu(np.zeros((2, 2 * SWIGLU_CHUNK + 2 * LANES + 2), np.float32))  # in this thread
    swiglu(np.zeros((2, 2 * SERIAL_SWIGLU), np.float32))  # on the kernel threads
    rms_rows(np.ones((1, 3 * LANES), np.float32), 1e-6)
    rows = np.zeros((1, 2, 1, 8), np.float32)[:, 1]  # (N, Hkv, Dh), strided as a step's k and v
    store_rows(np.zeros((1, 2, 1, 4, 8), np.float16), np.zeros(1, np.int64), np.zeros(1, np.int64), rows)
    angles = np.zeros((1, 1, 4), np.float32)  # (N, 1, R/2)
    rotate(np.zeros((1, 2 * 8 + 8), np.float32)[:, :16].reshape(1, 2, 8), angles, angles, 8)  # a strided (N, H, Dh)
    from worker.engine.kernels import (  # loaded only when an image build warms them
        draw_kernels,
        float_matmul,
        interleaved_k_matmul,
        interleaved_matmul,
        mxfp4_matmul,
    )

    float_matmul.warm({16, 32})
    interleaved_matmul.warm()
    interleaved_k_matmul.warm()
    mxfp4_matmul.warm()
    draw_kernels.warm()
