"""Weights the kernels read are read-only views, whether built in memory at load or mapped from the repack cache.

Numba types a read-only array apart from a writeable one, and a kernel compiles once for each typing it meets: the
Q4_K/Q6_K kernel was compiled for writeable and for mapped arrays, 60-75 s each on a cold cache (Xeon). Each
interleaved matrix freezes its arrays as it is made, so every kernel compiles for one typing.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view of `array` (the array itself stays as it was)."""
    view = array.view()
    view.flags.writeable = False
    return view


def freeze_arrays(matrix: Any, arrays: dict[str, np.ndarray]) -> None:
    """Replace each of a frozen dataclass's named arrays by a read-only view of it."""
    for name, array in arrays.items():
        object.__setattr__(matrix, name, read_only(array))
