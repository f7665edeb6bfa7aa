"""kill -9 the worker holding a Responses API stream: another worker resumes it from the journal and the openai
SDK's client sees one unbroken response, identical to an undisturbed run (real Redis, gateway, two SmolLM2
workers)."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.faults.process_cluster import MODEL, stream_through_a_kill

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ASK = "Tell me a long story about a lighthouse keeper and his cat."


def _stream(base: str, result: dict[str, Any]) -> None:
    """One greedy streamed response: its event types, text-delta arrival times and last event's response."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    result["types"], result["times"], result["deltas"] = [], [], []
    try:
        with client.responses.stream(model=MODEL, input=ASK, max_output_tokens=120, temperature=0) as stream:
            for event in stream:
                result["types"].append(event.type)
                if event.type == "response.output_text.delta":
                    result["times"].append(time.monotonic())
                    result["deltas"].append(event.delta)
                result["last"] = event
    except openai.APIError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"


def test_kill_9_of_the_worker_holding_a_responses_stream_is_invisible(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="2",
                            LLMFLEET_LEASE_S="30")
    undisturbed, disturbed, killed_at = stream_through_a_kill(cluster, _stream)
    got, want = disturbed["last"].response, undisturbed["last"].response
    def collapsed(types: list[str]) -> list[str]:  # how the text is cut into deltas is the workers' business
        return [t for i, t in enumerate(types) if t != "response.output_text.delta" or types[i - 1] != t]

    assert collapsed(disturbed["types"]) == collapsed(undisturbed["types"])  # one message item, never reopened
    assert "".join(disturbed["deltas"]) == "".join(undisturbed["deltas"]) == want.output_text
    assert got.output_text == want.output_text and got.status == want.status
    assert got.usage.output_tokens == want.usage.output_tokens
    assert got.usage.input_tokens == want.usage.input_tokens
    assert disturbed["types"].count("response.created") == 1
    assert disturbed["types"][-1] in ("response.completed", "response.incomplete")
    gaps = [b - a for a, b in zip(disturbed["times"], disturbed["times"][1:]) if b > killed_at]
    assert max(gaps, default=0) < 6, f"the stream was silent for {max(gaps):.1f}s"
    stored = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused").responses.retrieve(got.id)
    assert stored.output_text == want.output_text and stored.status == want.status
