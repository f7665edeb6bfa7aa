"""kill -9 of the gateway serving streams, with a second gateway up (real redis-server, two gateways and a SmolLM2
worker as processes):
- each chat client reconnects to the other gateway with `Last-Event-ID` and assembles text byte-identical to an
  undisturbed run, its events numbered 0..n once each (no duplicate, no gap);
- a background Responses stream read on the killed gateway is read on, from the other one, with
  `?stream=true&starting_after=N`, identical to an undisturbed run, and the other gateway adopts and stores it;
- a client that never comes back has its job cancelled within LLMFLEET_ORPHAN_GRACE_S + 1 s of the kill.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from shared import keys
from tests.faults.process_cluster import MODEL, wait_until
from tests.support.cluster import start_extra_gateway
from tests.support.sse import split_id

pytestmark = [pytest.mark.slow, pytest.mark.integration]
GRACE_S = 6.0
STREAMS = 8  # chat streams on the gateway killed (issue 42), beside a background response and an abandoned one
CHAT = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": 64, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]}
RESPONSE = {"model": MODEL, "stream": True, "background": True, "temperature": 0, "max_output_tokens": 64,
            "input": "Tell me a long story about a lighthouse keeper."}


def _read(reply: httpx.Response, result: dict[str, Any]) -> None:
    """Append every event of an SSE reply to result["events"] as (id, payload), until it ends or breaks."""
    buffer = b""
    for raw in reply.iter_raw():
        buffer += raw
        *frames, buffer = buffer.split(b"\n\n")
        for frame in frames:
            event_id, rest = split_id(frame)
            if rest == b"data: [DONE]":
                result["done"] = True
            elif event_id is not None:
                result["events"].append((event_id, json.loads(rest.split(b"data: ", 1)[1])))


def _client(first: str, second: str, path: str, body: dict[str, Any], result: dict[str, Any],
            resume: str | None) -> None:
    """Stream from `first`; when it breaks, resume from `second` after the last event got (unless resume is None)."""
    result["events"] = []
    try:
        with httpx.stream("POST", first + path, json=body, timeout=120) as reply:
            _read(reply, result)
    except httpx.HTTPError:
        result["broke"] = True
    if resume is None or not result.get("broke"):
        return
    event = result["events"][0][1]  # a chat chunk names its completion, response.created its response
    stream_id = event["response"]["id"] if "response" in event else event["id"]
    last = result["events"][-1][0]
    url = second + resume.format(id=stream_id, after=last)
    headers = {} if "starting_after" in url else {"Last-Event-ID": str(last)}
    with httpx.stream("GET", url, headers=headers, timeout=120) as reply:
        result["resumed_status"] = reply.status_code
        _read(reply, result)


def _chat_text(result: dict[str, Any]) -> str:
    return "".join(c["delta"].get("content") or "" for _, e in result["events"] for c in e.get("choices", []))


def _response_text(result: dict[str, Any]) -> str:
    return "".join(e["delta"] for _, e in result["events"] if e["type"] == "response.output_text.delta")


def test_kill_9_of_a_gateway_its_clients_resume_on_another_and_the_abandoned_job_is_cancelled(start_cluster,
                                                                                              tmp_path) -> None:
    cluster = start_cluster(1, LLMFLEET_SLOTS="12", LLMFLEET_ORPHAN_GRACE_S=str(GRACE_S),  # all 10 at once
                            LLMFLEET_STREAM_RETENTION_S="120")
    first = cluster.base_url
    _, second = start_extra_gateway(cluster, tmp_path / "gateway-2.log", wait_for="/ready")
    undisturbed_chat: dict[str, Any] = {}
    _client(first, second, "/v1/chat/completions", CHAT, undisturbed_chat, None)
    undisturbed_response: dict[str, Any] = {}
    _client(first, second, "/v1/responses", RESPONSE, undisturbed_response, None)
    assert undisturbed_chat.get("done") and len(_chat_text(undisturbed_chat)) > 50
    final = undisturbed_response["events"][-1][1]
    assert final["type"] == "response.incomplete" and len(_response_text(undisturbed_response)) > 50  # at the limit

    chats = [{} for _ in range(STREAMS)]
    background: dict[str, Any] = {}
    abandoned: dict[str, Any] = {}
    threads = [threading.Thread(target=_client, args=(first, second, "/v1/chat/completions", CHAT, r,
                                                       "/v1/chat/completions/{id}/stream")) for r in chats]
    threads.append(threading.Thread(target=_client, args=(first, second, "/v1/responses", RESPONSE, background,
                                                           "/v1/responses/{id}?stream=true&starting_after={after}")))
    threads.append(threading.Thread(target=_client, args=(first, second, "/v1/chat/completions", CHAT, abandoned,
                                                           None)))
    for thread in threads:
        thread.start()
    everyone = [*chats, background, abandoned]
    wait_until(lambda: all(len(r.get("events", [])) >= 4 for r in everyone), 120, "every stream to start")
    os.kill(cluster.gateway.pid, signal.SIGKILL)
    killed_at = time.monotonic()

    request_id = "req-" + abandoned["events"][0][1]["id"].removeprefix("chatcmpl-")
    wait_until(lambda: cluster.client.exists(keys.cancelled_marker(MODEL, request_id)), GRACE_S + 10,
               "the abandoned stream's cancel")
    cancelled_after = time.monotonic() - killed_at
    assert GRACE_S - 3.5 <= cancelled_after <= GRACE_S + 1.0, cancelled_after  # its last heartbeat + the grace
    for thread in threads:
        thread.join(timeout=180)
        assert not thread.is_alive(), "a stream hung"

    for result in chats:
        assert result.get("broke") and result.get("resumed_status") == 200 and result.get("done")
        ids = [event_id for event_id, _ in result["events"]]
        assert ids == list(range(len(ids)))  # no event twice, none missing
        assert _chat_text(result) == _chat_text(undisturbed_chat)
        assert len(result["events"]) == len(undisturbed_chat["events"])
    assert background.get("broke") and background.get("resumed_status") == 200
    assert [e["sequence_number"] for _, e in background["events"]] == list(range(len(background["events"])))
    assert _response_text(background) == _response_text(undisturbed_response)
    assert background["events"][-1][1]["response"]["status"] == final["response"]["status"]
    rid = background["events"][0][1]["response"]["id"]
    wait_until(lambda: httpx.get(f"{second}/v1/responses/{rid}").json()["status"] == "incomplete", 30,
               "the adopted background response to be stored")
