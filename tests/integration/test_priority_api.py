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
LOW_TOKENS = 400  # long enough that every low stream still decodes while the high requests run (a fast CPU makes
# SmolLM2's steps short: 80 tokens were done in about a second)


def test_a_high_priority_request_stops_running_low_priority_steps_and_nothing_is_lost(cluster: Any) -> None:
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    before = total(scrape(cluster.base_url), "llmfleet_worker_interrupted_steps_total", model=MODEL)
    lows: dict[int, int] = {}
    decoding = [threading.Event() for _ in range(6)]

    def low(i: int) -> None:
        stream = client.completions.create(model=MODEL, prompt=f"Story {i}: once upon a time", max_tokens=LOW_TOKENS,
                                           temperature=0, stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True, "priority": "low"})
        for chunk in stream:
            decoding[i].set()
            if chunk.usage is not None:
                lows[i] = chunk.usage.completion_tokens

    threads = [threading.Thread(target=low, args=(i,)) for i in range(6)]  # 3 on each of the 2 workers
    for thread, event in zip(threads, decoding):  # one at a time: a burst of 6 would pass the queue limit of 4
        thread.start()
        assert event.wait(timeout=120), "a low-priority stream never started"
    for _ in range(4):
        reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                          temperature=0, extra_body={"ignore_eos": True, "priority": "high"})
        assert reply.usage.completion_tokens == 8
    assert not lows, "the low-priority streams finished before the high-priority requests: nothing to interrupt"
    for thread in threads:
        thread.join(timeout=180)
    assert lows == {i: LOW_TOKENS for i in range(6)}  # stopped steps were redone: every stream is whole
    time.sleep(1.5)  # a heartbeat carries the workers' counters
    after = total(scrape(cluster.base_url), "llmfleet_worker_interrupted_steps_total", model=MODEL)
    assert after - before >= 1
