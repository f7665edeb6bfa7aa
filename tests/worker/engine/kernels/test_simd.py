"""The float32x8 intrinsics against numpy."""

from __future__ import annotations

import numpy as np
from numba import njit

from worker.engine.kernels.simd import (
    LANES,
    vadd,
    vbroadcast,
    vexp,
    vfma,
    vload,
    vload_u8,
    vload_wide,
    vmul,
    vstore,
    vsub,
    vsum,
    widen,
)


@njit(cache=False)
def _apply(a, b, codes, out_exp, out_fma):  # type: ignore[no-untyped-def]
    """Each operation over whole vectors of the inputs; returns the sum of a."""
    total = np.float32(0.0)
    for i in range(0, a.shape[0], LANES):
        x = vload(a, i)
        vstore(out_exp, i, vexp(x))
        vstore(out_fma, i, vfma(vsub(x, vload(b, i)), vload_u8(codes, i), vadd(vmul(x, vbroadcast(np.float32(2.0))), x)))
        total += vsum(x)
    return total


def test_vector_operations_agree_with_numpy() -> None:
    """exp within 2e-7 relative over softmax's range (and 0 below -88), fma/sub/mul/add exact, sum to rounding."""
    rng = np.random.default_rng(3)
    a = np.concatenate([np.linspace(-87, 88, 4000), rng.uniform(-20, 0, 4000), [-200.0] * 8]).astype(np.float32)
    b = rng.standard_normal(a.shape[0]).astype(np.float32)
    codes = rng.integers(0, 256, a.shape[0], dtype=np.uint8)
    out_exp, out_fma = np.empty_like(a), np.empty_like(a)
    total = _apply(a, b, codes, out_exp, out_fma)
    want = np.exp(a.astype(np.float64))
    inside = a > -87
    assert np.max(np.abs(out_exp[inside] - want[inside]) / want[inside]) < 2e-7
    assert np.all(out_exp[a < -88.4] == 0.0)
    np.testing.assert_allclose(out_fma, (a - b) * codes.astype(np.float32) + 3 * a, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(total, a.astype(np.float64).sum(), rtol=1e-5)


@njit(cache=False)
def _widen(values, out_vector, out_scalar):  # type: ignore[no-untyped-def]
    """float16 bits (or float32) to float32, eight at a time and one at a time."""
    for i in range(0, values.shape[0], LANES):
        vstore(out_vector, i, vload_wide(values, i))
    for i in range(values.shape[0]):
        out_scalar[i] = widen(values[i])


def test_wide_loads_are_exact() -> None:
    """Every float16 (normals, subnormals, zeros, infinities) widens to the same float32 as numpy's cast; float32
    passes through unchanged."""
    halves = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    halves = halves[~np.isnan(halves)]
    halves = halves[: halves.shape[0] // LANES * LANES]
    out_vector, out_scalar = np.empty(halves.shape, np.float32), np.empty(halves.shape, np.float32)
    _widen(halves.view(np.uint16), out_vector, out_scalar)
    np.testing.assert_array_equal(out_vector, halves.astype(np.float32))
    np.testing.assert_array_equal(out_scalar, halves.astype(np.float32))
    singles = halves.astype(np.float32) * np.float32(1.0001)
    _widen(singles, out_vector, out_scalar)
    np.testing.assert_array_equal(out_vector, singles)
    np.testing.assert_array_equal(out_scalar, singles)


@njit(fastmath=True, cache=False)
def _chain(a, b, c, n):  # type: ignore[no-untyped-def]
    """vsum of an n-step vfma chain from c, and one fused a * b + c, in a fastmath kernel (as the matmuls)."""
    acc = vload(c, 0)
    for _ in range(n):
        acc = vfma(vload(a, 0), vload(b, 0), acc)
    return vsum(acc), vsum(vfma(vload(a, 0), vload(b, 0), vload(c, 0)))


def test_fma_rounds_once_and_sums_are_not_reassociated_in_fastmath_kernels() -> None:
    """vfma is fused even inside fastmath=True: (1 + 2**-13)**2 - (1 + 2**-12) is 2**-26, not 0 as a separate
    multiply and add give; vsum adds in its documented order (a reassociated one gives another result here)."""
    a = np.full(LANES, 1 + 2.0**-13, np.float32)
    c = np.full(LANES, -(1 + 2.0**-12), np.float32)
    _, fused = _chain(a, a, c, 0)
    assert fused == np.float32(LANES * 2.0**-26)
    lanes = np.array([1e8, 1.0, -1e8, 1.0, 3.0, 1.0, 5.0, 1.0], np.float32)  # (8,)
    total, _ = _chain(np.zeros(LANES, np.float32), np.zeros(LANES, np.float32), lanes, 3)
    l0, l1, l2, l3, l4, l5, l6, l7 = (np.float32(v) for v in lanes)
    assert total == ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))


@njit(cache=False)
def _strict(a, b, c, fused, sums):  # type: ignore[no-untyped-def]
    """The strict fma of a, b, c and the strict lane sum of a."""
    for i in range(0, a.shape[0], LANES):
        vstore(fused, i, vfma(vload(a, i), vload(b, i), vload(c, i)))
        sums[i // LANES] = vsum(vload(a, i))


def test_strict_arithmetic_agrees_with_numpy() -> None:
    """The fma rounded once (a float64 product plus c, rounded to float32); the lane sum in its
    documented order ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), bit for bit."""
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(64).astype(np.float32) for _ in range(3))
    fused = np.empty(64, np.float32)
    sums = np.empty(8, np.float32)
    _strict(a, b, c, fused, sums)
    expected = (a.astype(np.float64) * b.astype(np.float64) + c).astype(np.float32)
    assert np.array_equal(fused, expected)
    lanes = a.reshape(8, 8)
    half = lanes[:, :4] + lanes[:, 4:]
    assert np.array_equal(sums, (half[:, 0] + half[:, 2]) + (half[:, 1] + half[:, 3]))
