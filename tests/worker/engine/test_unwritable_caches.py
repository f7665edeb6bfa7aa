"""Every cache under LLMFLEET_REPACK_DIR (repacked weights: repack_cache; derived files: derived_cache; measured
rates: measured_rate) falls back to memory when its directory cannot be written, with one warning per process.

Tests run as root, where a 0o555 directory does not stop writes, so an unwritable directory is made
deterministically: a path under a regular FILE (every mkdir or create there fails with ENOTDIR, and so does the
clean-up of a temporary file, as EROFS did). A full or read-only disk (ENOSPC, EROFS on the write and on the clean-up)
is played by failing `os.replace` and `Path.unlink` at the OS boundary."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.repack_dir import mapped_from_file
from tests.worker.engine.formats.test_repack_cache import pendings
from worker.engine import measured_rate
from worker.engine.formats import derived_cache, repack_cache
from worker.engine.weights.k_blocks import K_KINDS

WARNING = "cannot be written"


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no directory known to be unwritable."""
    monkeypatch.setattr(repack_cache, "_UNWRITABLE", set())


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A stand-in model file."""
    path = tmp_path / "m.gguf"
    path.write_bytes(os.urandom(3000))
    return path


@pytest.fixture
def under_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """LLMFLEET_REPACK_DIR set to a directory under a regular file: nothing can ever be written there."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    directory = blocker / "repack"
    monkeypatch.setenv("LLMFLEET_REPACK_DIR", str(directory))
    return directory


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_every_cache_falls_back_to_memory_with_one_warning(model_file: Path, under_a_file: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    builds: list[str] = []
    found = repack_cache.cached_blocks(model_file, pendings(builds), repack_cache.cache_dir())
    assert sorted(builds) == [f"w{i}" for i in range(3 + len(K_KINDS))] and not mapped_from_file(found["w0"].codes)
    path = derived_cache.derived_path(model_file, "facts")
    derived_cache.keep_json(path, {"a": 1})
    assert derived_cache.load_json(path) is None  # not kept: derived again next time
    derived = derived_cache.derived_array(model_file, "ids", lambda: np.arange(4), lambda a: True)
    assert derived.tolist() == [0, 1, 2, 3]
    rate = measured_rate.rate_file(model_file, 8)
    measured_rate.remember(rate, 123.0)
    assert measured_rate.remembered(rate) is None
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert str(under_a_file) in warnings[0] and "LLMFLEET_REPACK_DIR" in warnings[0] and "memory" in warnings[0]


@pytest.mark.parametrize("error", [errno.EROFS, errno.ENOSPC])
def test_a_failing_write_and_clean_up_is_a_warning_not_a_crash(model_file: Path, tmp_path: Path, error: int,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """The write fails (a read-only or full disk) and so does removing its temporary file (EROFS): before, the
    clean-up's error escaped the `except OSError` around the write and the worker exited at start."""
    monkeypatch.setenv("LLMFLEET_REPACK_DIR", str(tmp_path / "cache"))

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(derived_cache.os, "replace", refuse)
    monkeypatch.setattr(Path, "unlink", refuse)
    path = derived_cache.derived_path(model_file, "facts")
    derived_cache.keep_json(path, {"a": 1})
    derived_cache.keep_json(derived_cache.derived_path(model_file, "other"), {"b": 2})
    measured_rate.remember(measured_rate.rate_file(model_file, 8), 50.0)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and os.strerror(error) in warnings[0], warnings


def test_a_read_only_directory_filled_beforehand_is_still_read(model_file: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An image's pre-built repack file is mapped although nothing can be written beside it (no lock taken)."""
    cache = tmp_path / "cache"
    repack_cache.cached_blocks(model_file, pendings([]), cache)
    repack_cache.note_unwritable(cache, OSError(errno.EROFS, os.strerror(errno.EROFS)))
    builds: list[str] = []
    found = repack_cache.cached_blocks(model_file, pendings(builds), cache)
    assert builds == [] and mapped_from_file(found["w0"].codes)  # mapped from the file, nothing rebuilt
