"""The start-up decode-rate measurement, remembered beside the repack cache so a warm start skips it.

A worker publishes a full decode step's rate for admission's first guess before real rates arrive; measuring
it runs two decode steps, which took 1-3 s of every start of a 1B-8B model. The first measurement on a machine
is written to `<repack dir>/<model file>.<model key>.rate-<path>-<threads>t.json` (atomically) and read back by
every later start of the same file with the same kernel threads and instruction path; no repack directory
(LLMFLEET_REPACK_DIR set empty) means measuring every time. A remembered guess from a busy moment errs low,
the safe side: admission queues less until the worker's real rates replace it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numba

from worker.engine.repack_cache import cache_dir, model_key
from worker.engine.simd_int import int_path

log = logging.getLogger(__name__)


def rate_file(model_path: str | Path, rows: int) -> Path | None:
    """Where the rate of `rows`-wide steps of this model file on this machine is kept (None: no cache dir)."""
    directory = cache_dir()
    if directory is None:
        return None
    name = Path(model_path).name
    return directory / f"{name}.{model_key(model_path)}.rate-{int_path()}-{numba.get_num_threads()}t-{rows}r.json"


def remembered(path: Path | None) -> float | None:
    """The rate kept in `path`, or None when there is none (or it is unreadable)."""
    if path is None:
        return None
    try:
        rate = float(json.loads(path.read_text())["tokens_per_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rate if rate > 0 else None


def remember(path: Path | None, rate: float) -> None:
    """Keep `rate` in `path` (written whole or not at all; a failure only means measuring again next time)."""
    if path is None:
        return
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"tokens_per_s": rate}))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not keep the measured decode rate in %s (%s)", path, exc)
        tmp.unlink(missing_ok=True)
