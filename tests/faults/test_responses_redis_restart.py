"""Redis down, then restarted empty, under the Responses API (real redis-server, gateway and a SmolLM2 worker):
stored responses are lost with it, and that surfaces as OpenAI-shaped 503s while Redis is away and 404s after,
never a 500; new responses are served again once the worker is back."""

from __future__ import annotations

import time

import openai
import pytest

from llmfleet.redis_server import BundledRedis
from tests.faults.process_cluster import MODEL, ready, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_redis_restart_loses_stored_responses_as_404s_not_500s(start_cluster) -> None:
    cluster = start_cluster(1, LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="3",
                            LLMFLEET_LEASE_S="4", LLMFLEET_REQUEST_TIMEOUT_S="60", LLMFLEET_RETRY_AFTER_S="1")
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    first = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    port = cluster.redis.port
    cluster.redis.stop()
    with pytest.raises(openai.APIStatusError) as down:
        client.responses.retrieve(first.id)
    assert down.value.status_code == 503 and down.value.body["code"] == "unavailable"
    with pytest.raises(openai.APIStatusError) as down:
        client.responses.create(model=MODEL, input="Again.", previous_response_id=first.id, max_output_tokens=8)
    assert down.value.status_code == 503
    replacement = BundledRedis(port=port).start()  # the same port, and nothing in it
    try:
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.retrieve(first.id)
        assert gone.value.body["code"] == "response_not_found"
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.create(model=MODEL, input="Again.", previous_response_id=first.id, max_output_tokens=8)
        assert gone.value.body["code"] == "previous_response_not_found"
        wait_until(lambda: ready(cluster.base_url).get("ready") is True, 30, "/ready after the restart")
        deadline = time.monotonic() + 30
        while True:
            try:
                again = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0)
                break
            except openai.APIStatusError as exc:
                assert exc.status_code in (503, 429), exc
                assert time.monotonic() < deadline, "not served again after the restart"
                time.sleep(0.5)
        assert again.output_text == first.output_text
        assert client.responses.retrieve(again.id).output_text == again.output_text
    finally:
        replacement.stop()
