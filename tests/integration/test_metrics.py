"""/metrics on the real cluster: a known request moves the gateway's counters by exactly its tokens, and
both workers' own statistics (published with their heartbeats) appear in the same scrape."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"


def scrape(base_url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] of every sample of /metrics."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    return sum(v for got, v in samples.get(name, []) if labels.items() <= got.items())


def test_a_known_request_moves_the_counters_and_every_worker_reports(cluster: Any) -> None:
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    before = scrape(cluster.base_url)
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 6
    time.sleep(1.5)  # a heartbeat (0.5 s here) carries the worker's new counters
    after = scrape(cluster.base_url)
    assert total(after, "llmfleet_generation_tokens_total", model=MODEL) - \
        total(before, "llmfleet_generation_tokens_total", model=MODEL) == 6
    assert total(after, "llmfleet_prompt_tokens_total", model=MODEL) - \
        total(before, "llmfleet_prompt_tokens_total", model=MODEL) == reply.usage.prompt_tokens
    assert total(after, "llmfleet_request_success_total", model=MODEL, finish_reason="length") - \
        total(before, "llmfleet_request_success_total", model=MODEL, finish_reason="length") == 1
    assert total(after, "llmfleet_e2e_request_latency_seconds_count", model=MODEL) - \
        total(before, "llmfleet_e2e_request_latency_seconds_count", model=MODEL) == 1
    workers = {labels["worker"] for labels, v in after["llmfleet_worker_up"] if labels["model"] == MODEL and v == 1}
    assert len(workers) == 2
    generated = total(after, "llmfleet_worker_generation_tokens_total", model=MODEL) - \
        total(before, "llmfleet_worker_generation_tokens_total", model=MODEL)
    assert generated >= 6  # the worker's own count (other tests' requests may land in the same window)
    assert all(0 <= v <= 1 for _, v in after["llmfleet_kv_cache_usage_ratio"])
