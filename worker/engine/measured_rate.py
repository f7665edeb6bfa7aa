"""The start-up decode-rate measurement, remembered beside the repack cache so a warm start skips it.

A worker publishes a full decode step's rate for admission's first guess before real rates arrive; measuring
it runs two decode steps, which took 1-3 s of every start of a 1B-8B model. The first measurement on a machine
is kept (worker/engine/formats/derived_cache.py) per model file, kernel revision, kernel instruction path, kernel threads
and step width, and read back by every later start. A remembered guess from a busy moment errs low, the safe side:
admission queues less until the worker's real rates replace it.
"""

from __future__ import annotations

from pathlib import Path

import numba

from worker.engine.formats.derived_cache import derived_path, keep_json, load_json
from worker.engine.kernels.simd_int import int_path

KERNEL_REVISION = 6  # raised when a kernel change moves the decode rate: a kept rate from an older one is not read


def rate_file(model_path: str | Path | None, rows: int) -> Path | None:
    """Where the rate of `rows`-wide steps of this model file on this machine is kept (None: not kept, or no
    model file)."""
    return derived_path(model_path, f"rate-k{KERNEL_REVISION}-{int_path()}-{numba.get_num_threads()}t-{rows}r")


def remembered(path: Path | None) -> float | None:
    """The rate kept in `path`, or None when there is none (or it is unreadable)."""
    value = load_json(path)
    try:
        rate = float(value["tokens_per_s"])
    except (KeyError, TypeError, ValueError):
        return None
    return rate if rate > 0 else None


def remember(path: Path | None, rate: float) -> None:
    """Keep `rate` in `path` (written whole or not at all; a failure only means measuring again next time)."""
    keep_json(path, {"tokens_per_s": rate})
