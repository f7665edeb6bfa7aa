"""kill -9 the worker holding an Anthropic stream: another worker resumes it from the journal and the anthropic
SDK's client sees one unbroken message, identical to an undisturbed run (real Redis, gateway, two SmolLM2 workers)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.faults.process_cluster import MODEL, stream_through_a_kill

anthropic = pytest.importorskip("anthropic")
pytestmark = [pytest.mark.slow, pytest.mark.integration]
ASK = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and his cat."}]


def _stream(base: str, result: dict[str, Any]) -> None:
    """One greedy streamed message: its event types, text-delta arrival times and final message."""
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)
    result["types"], result["times"] = [], []
    try:
        with client.messages.stream(model=MODEL, max_tokens=120, messages=ASK, extra_body={"temperature": 0}) as s:
            for event in s:
                result["types"].append(event.type)
                if event.type == "content_block_delta":
                    result["times"].append(time.monotonic())
            result["message"] = s.get_final_message()
    except anthropic.APIError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"


def test_kill_9_of_the_worker_holding_a_message_stream_is_invisible(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="2",
                            LLMFLEET_LEASE_S="30")
    undisturbed, disturbed, killed_at = stream_through_a_kill(cluster, _stream)
    got, want = disturbed["message"], undisturbed["message"]
    assert got.content[0].text == want.content[0].text and got.stop_reason == want.stop_reason
    assert got.usage.output_tokens == want.usage.output_tokens
    assert (got.usage.input_tokens + got.usage.cache_read_input_tokens
            == want.usage.input_tokens + want.usage.cache_read_input_tokens)
    assert disturbed["types"].count("message_start") == 1 and disturbed["types"][-1] == "message_stop"
    assert disturbed["types"].count("content_block_start") == 1  # one text block, never reopened
    gaps = [b - a for a, b in zip(disturbed["times"], disturbed["times"][1:]) if b > killed_at]
    assert max(gaps, default=0) < 6, f"the stream was silent for {max(gaps):.1f}s"
