"""The repack cache of a test session. The model files tests make in temporary folders (and their copies of the
real models) would otherwise pile up in the user's ~/.cache/llmfleet/repack, one new file per run: unless the caller
set LLMFLEET_REPACK_DIR, the session repacks into a folder of its own (tests/conftest.py removes it at the end), and
the processes the tests start inherit it."""

from __future__ import annotations

import os
import tempfile

USER_REPACK_DIR = os.environ.get("LLMFLEET_REPACK_DIR")  # the caller's setting (None: serve's default folder)
SESSION_REPACK_DIR = None if USER_REPACK_DIR is not None else tempfile.mkdtemp(prefix="llmfleet-test-repack-")
if SESSION_REPACK_DIR is not None:
    os.environ["LLMFLEET_REPACK_DIR"] = SESSION_REPACK_DIR
