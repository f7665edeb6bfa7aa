"""Redis restarted empty under a live cluster (real redis-server, gateway and SmolLM2 worker processes).

Every open request ends (completed, or a retryable error the client sees) within its deadline, the worker
and the gateway recover by themselves, and no request is told its model does not exist.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from llmfleet.redis_server import BundledRedis
from tests.faults.process_cluster import MODEL, ready, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]


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


def test_redis_restarted_empty_mid_stream(start_cluster) -> None:
    cluster = start_cluster(1, LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="3",
                            LLMFLEET_LEASE_S="4", LLMFLEET_REQUEST_TIMEOUT_S="60")
    base, server = cluster.base_url, cluster.redis
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
        wait_until(lambda: ready(base).get("ready") is True, 15, "/ready after the restart")
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
