"""worker.engine.kernels.numba_runtime: the kernels' vector scratch starts on a 64-byte boundary (numba's own arrays on 32);
the OpenMP spin a model load chooses (long for a decoder, short beside an encoder's BLAS), an operator's kept."""

from __future__ import annotations

import os

import pytest
from numba import njit

from worker.engine.kernels import numba_runtime
from worker.engine.kernels.numba_runtime import (
    SPIN_ALONE,
    SPIN_WITH_BLAS,
    aligned_bytes,
    aligned_floats,
    set_spin,
)


@njit
def _scratch_offsets(count: int) -> tuple[int, int, int, int]:  # pragma: no cover (compiled)
    """Each scratch's address mod 64 and its length."""
    raw, floats = aligned_bytes(count), aligned_floats(count)
    return raw.ctypes.data % 64, floats.ctypes.data % 64, raw.size, floats.size


def test_scratch_is_64_byte_aligned_and_of_its_length() -> None:
    for count in (1, 37, 4096):
        for _ in range(20):  # allocations land on either 32-byte phase
            assert _scratch_offsets(count) == (0, 0, count, count)


def test_the_spin_is_long_for_a_decoder_short_beside_blas_and_an_operators_value_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numba_runtime, "_SPIN_GIVEN", False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "1")
    set_spin(with_blas=False)
    assert int(os.environ["GOMP_SPINCOUNT"]) == SPIN_ALONE
    set_spin(with_blas=True)
    assert int(os.environ["GOMP_SPINCOUNT"]) == SPIN_WITH_BLAS < SPIN_ALONE
    monkeypatch.setattr(numba_runtime, "_SPIN_GIVEN", True)
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    set_spin(with_blas=False)
    assert os.environ["GOMP_SPINCOUNT"] == "7"
