"""Read-only container images: a worker whose repack directory cannot be written serves from memory (one warning, no
traceback); one whose empty model cache cannot be written exits with one line naming the directory and
LLMFLEET_CACHE. An unwritable directory is a path under a regular file (tests run as root: a 0o555 directory would
still be written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.faults.process_cluster import MODEL


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_with_an_unwritable_repack_directory_serves_from_memory(start_cluster, tmp_path: Path) -> None:
    blocker = tmp_path / "read-only-image"
    blocker.write_bytes(b"")
    cluster = start_cluster(1, LLMFLEET_REPACK_DIR=str(blocker / "repack"))
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert reply.choices[0].text and reply.usage.completion_tokens == 8
    log = cluster.logs[0].read_text()
    assert "Traceback" not in log
    assert log.count("cannot be written") == 1 and str(blocker / "repack") in log and "LLMFLEET_REPACK_DIR" in log


def test_a_worker_whose_empty_model_cache_cannot_be_written_exits_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "read-only-image"
    blocker.write_bytes(b"")
    env = {**os.environ, "LLMFLEET_CACHE": str(blocker / "cache"), "REDIS_URL": "redis://127.0.0.1:1/0"}
    done = subprocess.run([sys.executable, "-m", "llmfleet.cli", "worker", "--model", "smollm2"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(blocker / "cache") in lines[0] and "LLMFLEET_CACHE" in lines[0]
