"""The host KV tier of a test session. Workers the tests start (in-process or as processes) would otherwise share
/dev/shm/llmfleet-kv with each other and with real workers on the machine, and leave a file per temporary model
there: unless the caller set LLMFLEET_KV_TIER_DIR, the session's tiers live in a folder of its own
(tests/conftest.py removes it at the end), which the processes the tests start inherit."""

from __future__ import annotations

import os
import tempfile

SESSION_KV_TIER_DIR = (None if os.environ.get("LLMFLEET_KV_TIER_DIR")
                       else tempfile.mkdtemp(prefix="llmfleet-test-kv-tier-"))
if SESSION_KV_TIER_DIR is not None:
    os.environ["LLMFLEET_KV_TIER_DIR"] = SESSION_KV_TIER_DIR
