"""worker.engine.kernels.numba_runtime: the kernels' vector scratch starts on a 64-byte boundary (numba's own arrays on 32);
the OpenMP spin a model load chooses (long for a decoder, short beside an encoder's BLAS), an operator's kept; a
launch's task queue (guided bounds, taken once each across threads); a kernel factory's closures cached apart."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import njit, prange

from worker.engine.kernels import numba_runtime
from worker.engine.kernels.numba_runtime import (
    FINEST_SPLIT,
    SPIN_ALONE,
    SPIN_WITH_BLAS,
    aligned_bytes,
    aligned_floats,
    guided_bounds,
    set_spin,
    take_next,
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


@njit
def _bounds(items: int, threads: int) -> np.ndarray:  # pragma: no cover (compiled)
    """guided_bounds from compiled code (it is inlined into the kernels)."""
    return guided_bounds(items, threads)


@pytest.mark.parametrize(("items", "threads"), [(1, 2), (7, 2), (192, 2), (8016, 2), (8016, 16), (100, 1)])
def test_guided_tasks_cover_every_item_once_long_first_and_never_finer_than_the_finest_split(items: int,
                                                                                               threads: int) -> None:
    bounds = _bounds(items, threads)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == items and (sizes > 0).all()
    assert (np.diff(sizes) <= 0).all()  # long runs first, short ones last
    assert sizes[0] == -(-items // (2 * threads)) or sizes[0] == max(1, items // FINEST_SPLIT)
    assert (sizes[:-1] >= max(1, items // FINEST_SPLIT)).all()  # only the very last may be a remainder
    assert len(sizes) <= min(items, 2 * FINEST_SPLIT + 1)  # the room guided_bounds allocates


@njit(parallel=True)
def _take_all(tasks: int, taken: np.ndarray) -> None:  # pragma: no cover (compiled)
    """Every thread takes tasks from one queue until none is left, counting each task it got."""
    queue = np.zeros(1, np.int64)
    for _ in prange(numba.get_num_threads()):
        task = take_next(queue)
        while task < tasks:
            taken[task] += 1
            task = take_next(queue)


def test_the_queue_hands_each_task_to_exactly_one_thread() -> None:
    taken = np.zeros(5000, np.int64)
    _take_all(len(taken), taken)
    assert (taken == 1).all()


_FACTORY = """
from numba import njit
from worker.engine.kernels.numba_runtime import own_cache_index


def factory(constant):
    @njit(cache=True)
    @own_cache_index(constant)
    def scaled(x):
        return x * constant

    return scaled


print(factory(2)(10.0), factory(3)(10.0))
"""


def test_a_factorys_closures_keep_cache_indexes_of_their_own(tmp_path: Path) -> None:
    """Each closure a kernel factory makes is cached under a name of its own (one index file each, so two processes
    compiling different ones at once cannot share a data file), and a second process loads each one's own code."""
    (tmp_path / "kernel_factory.py").write_text(textwrap.dedent(_FACTORY))
    env = os.environ | {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": f"{tmp_path}:{Path(__file__).parents[4]}"}
    runs = [subprocess.run([sys.executable, "-c", "import kernel_factory"], env=env, capture_output=True, text=True,
                           check=True).stdout for _ in range(2)]
    assert runs == ["20.0 30.0\n"] * 2
    indexes = sorted(p.name.split("-")[0] for p in (tmp_path / "cache").rglob("*.nbi"))
    assert indexes == ["kernel_factory.factory.locals.scaled_2", "kernel_factory.factory.locals.scaled_3"]
