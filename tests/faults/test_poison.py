"""A poison job: every worker that takes it dies on it (here: the test kill -9s whichever worker holds it, each
time it is taken). With LLMFLEET_MAX_DELIVERIES=2 the third taking sets it aside in the dead-letter stream
instead of running it, and the client, which had been streaming all along, gets a clear error and [DONE].

Real redis-server, gateway and three SmolLM2 workers as processes, the official openai client.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest
import redis

from shared import codec, keys
from tests.faults.process_cluster import MODEL, job_holders, model_streams
from tests.faults.process_cluster import wait_until as _wait

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _stream(base: str, result: dict) -> None:
    """One long streaming completion: chunk arrival times, the text, and the error it ended with."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=180)
    result["times"], result["text"] = [], ""
    try:
        for chunk in client.completions.create(model=MODEL, prompt="Once upon a time", stream=True, temperature=0,
                                               max_tokens=600, extra_body={"ignore_eos": True}):
            result["times"].append(time.monotonic())
            result["text"] += "".join(c.text for c in chunk.choices)
    except openai.APIError as exc:
        result["error"] = exc
    except httpx.HTTPError as exc:
        result["transport_error"] = exc
    result["ended"] = time.monotonic()


def test_a_job_every_holder_dies_on_is_dead_lettered_and_the_client_told(start_cluster) -> None:
    cluster = start_cluster(3, LLMFLEET_SLOTS="2", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="2",
                            LLMFLEET_LEASE_S="30", LLMFLEET_MAX_DELIVERIES="2")
    client = redis.Redis.from_url(cluster.redis.url)
    result: dict = {}
    thread = threading.Thread(target=_stream, args=(cluster.base_url, result))
    thread.start()
    killed: list[int] = []
    for epoch in (1, 2):  # the first taking, then the takeover after the first death
        def taken(epoch: int = epoch) -> bool:
            owners = client.keys(keys.owner_key(MODEL, "*"))
            return bool(owners) and (client.get(owners[0]) or b"").startswith(f"{epoch}:".encode())

        _wait(taken, 120, f"the job to be taken (owner epoch {epoch})")
        chunks = len(result.get("times", []))
        _wait(lambda chunks=chunks: len(result["times"]) >= chunks + 3, 60, "the stream to run on that worker")
        holder = job_holders(client)[0]
        index = cluster.worker_index(holder)
        os.kill(cluster.workers[index].pid, signal.SIGKILL)
        killed.append(index)
    second_kill = time.monotonic()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the stream hung"

    error = result.get("error")
    assert error is not None, f"the stream did not end with an error: {result}"
    assert error.body["code"] == "dead_lettered" and "set aside" in error.message
    assert "transport_error" not in result
    assert result["ended"] - second_kill < 10, "the client heard of it late"
    assert len(result["times"]) >= 6 and result["text"]  # it streamed until the job was set aside

    dead = client.xrange(keys.deadletter_stream(MODEL))
    assert len(dead) == 1 and dead[0][1][b"deliveries"] == b"2"
    survivor = ({0, 1, 2} - set(killed)).pop()
    assert cluster.worker_index(dead[0][1][b"worker"].decode()) == survivor
    assert codec.decode_job(dead[0][1][keys.JOB_FIELD.encode()]).prompt == "Once upon a time"
    for stream in model_streams(client):  # nobody retries it
        assert not client.exists(stream) or (client.xpending(stream, keys.JOBS_GROUP)["pending"], client.xlen(stream)) == (0, 0)
    survivor_log = cluster.logs[survivor].read_text()
    assert "dead-lettered job" in survivor_log and "Once upon a time" not in survivor_log
    print(f"\ndead-lettered {result['ended'] - second_kill:.2f}s after the second kill, "
          f"{len(result['times'])} chunks streamed before the error")
