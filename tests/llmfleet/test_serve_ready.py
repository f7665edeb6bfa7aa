"""`llmfleet serve`'s readiness tells the truth: the moment /ready first answers 200, the model is registered and
loaded (the gateway's own /v1/models says so) and a chat request without `model` is served (200, not 400); the
"llmfleet is serving" line comes no earlier."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmfleet.redis_server import free_port
from tests.support.processes import stop_serve

pytestmark = [pytest.mark.slow, pytest.mark.integration]
SERVING_LINE = b"llmfleet is serving"


def test_the_first_ready_serves_a_request_without_model(smollm2_gguf_path: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "LLMFLEET_SLOTS": "2", "LLMFLEET_KV_BUDGET_MIB": "64", "LLMFLEET_LOG_LEVEL": "INFO"}
    env.pop("REDIS_URL", None)
    out_path, log_path = tmp_path / "serve.out", tmp_path / "serve.log"
    with out_path.open("wb") as out, log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "llmfleet.cli", "serve", "--port", str(port), "--model",
                                    "smollm2-135m"], env=env, stdout=out, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, not_ready = time.monotonic() + 300, []
        while True:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            printed = SERVING_LINE in out_path.read_bytes()  # serve prints once it saw /ready say yes
            try:
                ready = httpx.get(base + "/ready", timeout=2)
            except httpx.HTTPError:
                ready = None
            if ready is not None and ready.status_code == 200:
                break
            assert not printed, f"serve said it is serving, then /ready said {ready and ready.text}"
            if ready is not None:
                not_ready.append(ready.json())
            time.sleep(0.05)
        models = {m["id"]: m for m in httpx.get(base + "/v1/models", timeout=5).json()["data"]}
        chat = httpx.post(base + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0})
        assert chat.status_code == 200, chat.text
        assert chat.json()["model"] == "smollm2-135m" and chat.json()["choices"][0]["message"]["content"]
        assert models["smollm2-135m"]["loaded"] is True, models
        assert ready.json()["models"] == {"smollm2-135m": "ready"} and ready.json()["workers"] == 1
        assert any("smollm2-135m (" in " ".join(body.get("waiting_for", [])) for body in not_ready), not_ready[-3:]
        time.sleep(1.0)  # the supervisor polls /ready every half second before it prints
        assert SERVING_LINE in out_path.read_bytes()
    finally:
        stop_serve(process)
