"""`llmfleet serve` on the synthetic Llama-3.1-8B-shaped Q4_K_M file (../shared/peers/make-synthetic-model.sh 8b,
4.6 GB) becomes ready and answers a chat request from the unmodified openai client: the 8B fits a 24 GiB host.
Skipped where the file is absent (it is made, not pulled: CI has none). The repack cache is serve's own
(~/.cache/llmfleet/repack, not the session's: tests/support/repack_dir.py), so only a first run pays the repack
(minutes on 2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmfleet.catalogue import host_memory_bytes
from llmfleet.redis_server import free_port
from tests.support.processes import stop_serve
from tests.support.repack_dir import USER_REPACK_DIR

pytestmark = [pytest.mark.slow, pytest.mark.integration]
openai = pytest.importorskip("openai")
PEERS = Path(os.environ.get("LLMFLEET_PEERS", Path.home() / ".cache" / "llmfleet-peers"))
SYNTHETIC_8B = PEERS / "models" / "synthetic-llama-8b-Q4_K_M.gguf"
READY_WITHIN_S = 1800  # a cold repack of 4.6 GB on a shared 2-core machine; a warm start takes far less


def test_serve_answers_a_chat_request_on_the_8b(tmp_path: Path) -> None:
    if not SYNTHETIC_8B.is_file():
        pytest.skip(f"the synthetic 8B is absent ({SYNTHETIC_8B}): ../shared/peers/make-synthetic-model.sh 8b")
    if host_memory_bytes() < 16 << 30:
        pytest.skip("the 8B needs a host with 16 GiB of memory or more")
    port = free_port()
    env = {**os.environ, "LLMFLEET_SLOTS": "2", "LLMFLEET_KV_BUDGET_MIB": "256", "LLMFLEET_LOG_LEVEL": "INFO"}
    env.pop("REDIS_URL", None)
    if USER_REPACK_DIR is None:  # serve's own cache, kept between sessions (not the session's throwaway one)
        env.pop("LLMFLEET_REPACK_DIR", None)
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "llmfleet.cli", "serve", "--port", str(port), "--model",
                                    str(SYNTHETIC_8B)], env=env, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while not _ready(base):
            assert process.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(1)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=600, max_retries=0)
        reply = client.chat.completions.create(model=SYNTHETIC_8B.stem, max_tokens=3, temperature=0,
                                               messages=[{"role": "user", "content": "Say hi."}])
        assert reply.model == SYNTHETIC_8B.stem
        assert reply.choices[0].finish_reason in ("length", "stop")
        assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 3
    finally:
        stop_serve(process)


def _ready(base: str) -> bool:
    """Whether /ready answers 200."""
    try:
        return httpx.get(base + "/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
