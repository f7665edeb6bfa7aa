"""worker.engine.numba_runtime: the kernels' vector scratch starts on a 64-byte boundary (numba's own arrays on 32)."""

from __future__ import annotations

from numba import njit

from worker.engine.numba_runtime import aligned_bytes, aligned_floats


@njit
def _scratch_offsets(count: int) -> tuple[int, int, int, int]:  # pragma: no cover (compiled)
    """Each scratch's address mod 64 and its length."""
    raw, floats = aligned_bytes(count), aligned_floats(count)
    return raw.ctypes.data % 64, floats.ctypes.data % 64, raw.size, floats.size


def test_scratch_is_64_byte_aligned_and_of_its_length() -> None:
    for count in (1, 37, 4096):
        for _ in range(20):  # allocations land on either 32-byte phase
            assert _scratch_offsets(count) == (0, 0, count, count)
