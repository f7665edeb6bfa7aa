"""worker.engine.kernels.simd_int: the integer kernels' instruction path is the fastest this CPU runs unless
LLMFLEET_INT_KERNELS forces one; a path the CPU lacks, or an unknown one, is refused at start; `prefetch` is a hint
that changes no result."""

from __future__ import annotations

import platform
from collections.abc import Iterator

import numpy as np
import pytest
from numba import njit

from worker.engine.kernels import simd_int
from worker.engine.kernels.simd_int import PATHS, detected_path, int_path, prefetch, supported_paths


def test_the_fastest_supported_path_is_detected() -> None:
    assert detected_path() == supported_paths()[0] and set(supported_paths()) <= set(PATHS)
    assert supported_paths()[-1] == "generic"


@pytest.fixture
def fresh_path_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A monkeypatch under which int_path() chooses afresh (its cached choice is dropped before and after)."""
    int_path.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    int_path.cache_clear()


def test_a_path_this_cpu_lacks_is_refused(fresh_path_choice: pytest.MonkeyPatch) -> None:
    """Forcing AVX2 or AVX-512 VNNI on a CPU without them is refused at start, never an illegal instruction."""
    fresh_path_choice.setattr(simd_int.llvm_binding, "get_host_cpu_features", lambda: {"avx2": True})
    assert supported_paths() == ("avx2", "generic")
    fresh_path_choice.setenv("LLMFLEET_INT_KERNELS", "avx512vnni")
    with pytest.raises(ValueError, match="this CPU runs avx2, generic"):
        int_path()


def test_a_bad_path_setting_is_refused(fresh_path_choice: pytest.MonkeyPatch) -> None:
    fresh_path_choice.setenv("LLMFLEET_INT_KERNELS", "avx9")
    with pytest.raises(ValueError, match="LLMFLEET_INT_KERNELS"):
        int_path()


@njit(cache=False)
def _sum_asking_ahead(values: np.ndarray, ahead: int) -> int:  # pragma: no cover (compiled)
    total = 0
    for i in range(values.size):
        prefetch(values, i + ahead)  # past the end near the last elements: a hint never faults
        total += values[i]
    return total


def test_prefetch_is_a_hint_that_changes_nothing_and_never_faults() -> None:
    values = np.arange(1 << 16, dtype=np.uint8)
    assert _sum_asking_ahead(values, 4096) == int(values.sum(dtype=np.int64))
    assert _sum_asking_ahead(values, 1 << 40) == int(values.sum(dtype=np.int64))  # far outside any mapping
    if platform.machine() in ("x86_64", "AMD64"):
        assembly = next(iter(_sum_asking_ahead.inspect_asm().values()))
        assert "prefetcht0" in assembly
