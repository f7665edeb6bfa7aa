"""Priorities hold while work runs, on the real cluster: a high-priority request sent while low-priority streams
decode stops the running step of the worker it lands on (llmfleet_worker_interrupted_steps), gets its reply,
and every low-priority stream still completes whole."""

from __future__ import annotations

import threading
import time
from typing import Any

import openai
import pytest

from tests.integration.test_metrics import scrape, total

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
LOW_TOKENS = 80


def test_a_high_priority_request_stops_running_low_priority_steps_and_nothing_is_lost(cluster: Any) -> None:
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    before = total(scrape(cluster.base_url), "llmfleet_worker_interrupted_steps_total", model=MODEL)
    lows: dict[int, int] = {}

    def low(i: int) -> None:
        stream = client.completions.create(model=MODEL, prompt=f"Story {i}: once upon a time", max_tokens=LOW_TOKENS,
                                           temperature=0, stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True, "priority": "low"})
        for chunk in stream:
            if chunk.usage is not None:
                lows[i] = chunk.usage.completion_tokens

    threads = [threading.Thread(target=low, args=(i,)) for i in range(6)]  # 3 on each of the 2 workers
    for thread in threads:
        thread.start()
    time.sleep(3.0)  # every low stream is decoding
    for _ in range(4):
        reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                          temperature=0, extra_body={"ignore_eos": True, "priority": "high"})
        assert reply.usage.completion_tokens == 8
    for thread in threads:
        thread.join(timeout=180)
    assert lows == {i: LOW_TOKENS for i in range(6)}  # stopped steps were redone: every stream is whole
    time.sleep(1.5)  # a heartbeat carries the workers' counters
    after = total(scrape(cluster.base_url), "llmfleet_worker_interrupted_steps_total", model=MODEL)
    assert after - before >= 1
