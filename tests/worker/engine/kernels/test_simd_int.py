"""worker.engine.kernels.simd_int: the integer kernels' instruction path is the fastest this CPU runs unless
LLMFLEET_INT_KERNELS forces one; a path the CPU lacks, or an unknown one, is refused at start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from worker.engine.kernels import simd_int
from worker.engine.kernels.simd_int import PATHS, detected_path, int_path, supported_paths


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
