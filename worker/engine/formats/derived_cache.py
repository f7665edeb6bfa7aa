"""Things derived from a model file, kept beside its repack file so a warm start skips deriving them.

Each lives at `<repack dir>/<model file name>.<model key>.<what>.json` (or `.npy` for an integer array, read
without pickle; repack_cache.model_key: the file's size, mtime, first and last MiB and the layout version),
written whole or not at all (a temporary file renamed into place); an unreadable one counts as missing and is
derived again. No repack directory (LLMFLEET_REPACK_DIR set empty) or no model file (metadata built in memory)
means deriving every time; so does a directory that cannot be written (read-only, full): the first failure is
one warning (repack_cache.note_unwritable) and the process keeps what it derives in memory from then on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from worker.engine.formats.repack_cache import cache_dir, model_key, note_unwritable, writable

log = logging.getLogger(__name__)


def derived_path(model_path: str | Path | None, what: str, suffix: str = ".json") -> Path | None:
    """Where `what`, derived from the model file, is kept (None: no cache directory or no such file)."""
    directory = cache_dir()
    if directory is None or model_path is None or not Path(model_path).is_file():
        return None
    return directory / f"{Path(model_path).name}.{model_key(model_path)}.{what}{suffix}"


def load_json(path: Path | None) -> Any:
    """What `path` holds, or None when there is none (or it is unreadable)."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def keep_json(path: Path | None, value: Any) -> None:
    """Keep `value` in `path` atomically; a failure is logged and only means deriving it again next time."""
    _keep(path, lambda tmp: tmp.write_text(json.dumps(value), encoding="utf-8"))


def _keep(path: Path | None, write: Callable[[Path], None]) -> None:
    """Write `path` through a temporary file renamed into place (whole or not at all); failures are logged."""
    if path is None or not writable(path.parent):
        return
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        note_unwritable(path.parent, exc)
        with contextlib.suppress(OSError):  # a read-only directory refuses the clean-up too (EROFS)
            tmp.unlink(missing_ok=True)


def derived_array(model_path: str | Path | None, what: str, derive: Callable[[], np.ndarray],
                  valid: Callable[[np.ndarray], bool]) -> np.ndarray:
    """The kept array `what` of the model file when there is a valid one, else `derive()` (then kept)."""
    path = derived_path(model_path, what, ".npy")
    if path is not None:
        try:
            value = np.load(path, allow_pickle=False)
            if valid(value):
                return value
        except (OSError, ValueError):
            pass
    value = derive()
    _keep(path, lambda tmp: np.save(tmp, value, allow_pickle=False))
    return value
