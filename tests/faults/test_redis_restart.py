"""Redis restarted empty under a live cluster (real redis-server, gateway and SmolLM2 worker processes).

Every open request ends (completed, or a retryable error the client sees) within its deadline, the worker
and the gateway recover by themselves, and no request is told its model does not exist.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmfleet.redis_server import BundledRedis, free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"


@pytest.fixture()
def cluster(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[tuple[str, BundledRedis, dict[str, str]]]:
    """Redis, a gateway and one worker as processes; yields (gateway URL, the Redis, the env)."""
    try:
        server = BundledRedis().start()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    port = free_port()
    env = {**os.environ, "REDIS_URL": server.url, "LLMFLEET_PORT": str(port), "LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5",
           "LLMFLEET_HEARTBEAT_TTL_S": "3", "LLMFLEET_LEASE_S": "4", "LLMFLEET_REGISTRY_CACHE_S": "0",
           "LLMFLEET_REQUEST_TIMEOUT_S": "60", "LLMFLEET_THREADS": "1"}
    procs = []
    for name, args in (("gateway", ["gateway"]), ("worker", ["worker", "--model", MODEL])):
        with (tmp_path / f"{name}.log").open("wb") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "llmfleet.cli", *args], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _ready(base).get("ready") is True, 240, "the cluster")
        yield base, server, env
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()


def _ready(base: str) -> dict:
    try:
        return httpx.get(base + "/ready", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {}


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _complete(base: str, max_tokens: int, outcome: dict) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=90)
    started = time.monotonic()
    try:
        text = ""
        for chunk in client.completions.create(model=MODEL, prompt="Redis restarts, and then", max_tokens=max_tokens,
                                               temperature=0, stream=True, extra_body={"ignore_eos": True}):
            text += chunk.choices[0].text if chunk.choices else ""
            outcome["finish"] = (chunk.choices[0].finish_reason if chunk.choices else None) or outcome.get("finish")
        outcome["text"] = text
    except (openai.APIError, httpx.HTTPError) as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
        outcome["status"] = getattr(exc, "status_code", None)
    outcome["seconds"] = time.monotonic() - started


def test_redis_restarted_empty_mid_stream(cluster: tuple[str, BundledRedis, dict[str, str]]) -> None:
    base, server, _env = cluster
    open_request: dict = {}
    thread = threading.Thread(target=_complete, args=(base, 300, open_request))
    thread.start()
    time.sleep(2.0)  # streaming now
    port = server.port
    server.stop()
    time.sleep(3.0)  # Redis is down for 3 s
    replacement = BundledRedis(port=port).start()  # the same port, and nothing in it
    try:
        back = time.monotonic()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the open request hung"
        # it ended exactly once: completed, or a retryable error (never a 404, never silence)
        assert ("error" in open_request) != ("finish" in open_request and open_request.get("finish") == "length")
        if "error" in open_request:
            assert open_request.get("status") in (None, 503, 504), open_request
        _wait(lambda: _ready(base).get("ready") is True, 15, "/ready after the restart")
        statuses = []
        served = None
        while time.monotonic() - back < 30 and served is None:
            after: dict = {}
            _complete(base, 4, after)
            statuses.append(after.get("status"))
            if "error" not in after:
                served = time.monotonic() - back
            else:
                time.sleep(0.5)
        assert 404 not in statuses, statuses
        assert served is not None and served < 15, statuses
    finally:
        replacement.stop()
