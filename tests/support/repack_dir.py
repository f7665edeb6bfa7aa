"""The repack cache of a test session. The model files tests make in temporary folders (and their copies of the
real models) would otherwise pile up in the user's ~/.cache/llmfleet/repack, one new file per run: unless the caller
set LLMFLEET_REPACK_DIR, the session repacks into a folder of its own (tests/conftest.py removes it at the end), and
the processes the tests start inherit it."""

from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np

USER_REPACK_DIR = os.environ.get("LLMFLEET_REPACK_DIR")  # the caller's setting (None: serve's default folder)
SESSION_REPACK_DIR = None if USER_REPACK_DIR is not None else tempfile.mkdtemp(prefix="llmfleet-test-repack-")
if SESSION_REPACK_DIR is not None:
    os.environ["LLMFLEET_REPACK_DIR"] = SESSION_REPACK_DIR


def mapped_from_file(array: np.ndarray) -> bool:
    """Whether `array` is a view of a mapped file (the repack cache), not memory built at load: every weight array
    is read-only either way (worker/engine/weights/read_only.py), so only the memory behind it tells them apart."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)  # np.frombuffer's view of the mapping
