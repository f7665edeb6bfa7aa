"""SIGSTOP the worker holding a greedy stream past its heartbeat TTL: the other worker takes the job over with a
new owner epoch and resumes it from the journal; SIGCONT the stalled one while the stream still runs: it is
fenced off (its writes are refused) and drops the job. The client sees one uninterrupted stream.

Real redis-server, gateway and two SmolLM2 workers as processes, the official openai client. A pattern
subscriber records every event any worker managed to publish, so a stale worker's write would show.
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import openai
import pytest
import redis

from shared import codec, keys
from tests.faults.process_cluster import MODEL, job_holders, ready
from tests.faults.process_cluster import wait_until as _wait

pytestmark = [pytest.mark.slow, pytest.mark.integration]
PROMPT = "Write a long letter from a lighthouse keeper to his sister."
BODY = {"temperature": 0, "max_tokens": 200}


def _stream(base: str, result: dict) -> None:
    """One greedy streaming completion: its text and the arrival time of every chunk."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=180)
    result["times"], text = [], ""
    try:
        for chunk in client.completions.create(model=MODEL, prompt=PROMPT, stream=True,
                                               extra_body={"ignore_eos": True}, **BODY):
            result["times"].append(time.monotonic())
            text += "".join(c.text for c in chunk.choices)
            result["finish"] = next((c.finish_reason for c in chunk.choices if c.finish_reason), result.get("finish"))
    except (openai.APIError, httpx.HTTPError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["text"] = text


def test_a_stalled_worker_is_fenced_off_and_the_stream_resumes(start_cluster) -> None:
    cluster = start_cluster(2, LLMFLEET_SLOTS="4", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="2",
                            LLMFLEET_LEASE_S="30")
    base, client = cluster.base_url, redis.Redis.from_url(cluster.redis.url)
    undisturbed: dict = {}
    _stream(base, undisturbed)
    assert "error" not in undisturbed and undisturbed["finish"] == "length", undisturbed

    published: list[tuple[str, int, str]] = []
    pubsub = client.pubsub()
    pubsub.psubscribe(**{keys.events_channel(MODEL, "*"): lambda m: published.append(_identity(m["data"]))})
    assert pubsub.get_message(timeout=5)["type"] == "psubscribe"  # listening before the request is sent
    tap = pubsub.run_in_thread(sleep_time=0.01, daemon=True)
    disturbed: dict = {}
    thread = threading.Thread(target=_stream, args=(base, disturbed))
    thread.start()
    try:
        _wait(lambda: len(disturbed.get("times", [])) >= 5, 120, "the stream to be under way")
        holder_id = job_holders(client)[0]
        holder = cluster.worker_index(holder_id)
        request_id = published[0][0]
        cluster.workers[holder].send_signal(signal.SIGSTOP)
        stopped_at, chunks_at_stop = time.monotonic(), len(disturbed["times"])
        try:
            _wait(lambda: (client.get(keys.owner_key(MODEL, request_id)) or b"").startswith(b"2:"), 30,
                  "the other worker to take the job over (owner epoch 2)")
            taken_over_at = time.monotonic()
            _wait(lambda: len(disturbed["times"]) >= chunks_at_stop + 10, 60, "the stream to resume")
            assert thread.is_alive(), "the stream ended before the stalled worker woke up: make it longer"
        finally:
            cluster.workers[holder].send_signal(signal.SIGCONT)
        woke_at = time.monotonic()
        thread.join(timeout=180)
        assert not thread.is_alive(), "the stream hung"
    finally:
        tap.stop()
        tap.join(timeout=5)  # its last read ends before the cluster's teardown closes the connection under it
    assert "error" not in disturbed, disturbed["error"]
    assert disturbed["text"] == undisturbed["text"], "the resumed text differs from the undisturbed run"
    assert disturbed["finish"] == "length"
    seqs = [seq for rid, seq, _kind in published if rid == request_id]
    assert seqs == list(range(len(seqs))), "an event was published twice, out of order or not at all"
    assert [kind for rid, _seq, kind in published if rid == request_id][-1] == "DoneEvent"

    stalled_log = cluster.logs[holder]
    _wait(lambda: f"fenced off: job {request_id}" in stalled_log.read_text(), 20, "the woken worker to be fenced off")
    taker_log = cluster.logs[1 - holder].read_text()
    assert f"took over job {request_id} as owner epoch 2" in taker_log
    assert cluster.workers[holder].poll() is None  # it dropped the job, not its life
    _wait(lambda: ready(base).get("workers") == 2, 20, "the woken worker to register again")
    for log in cluster.logs:
        assert PROMPT not in log.read_text() and undisturbed["text"][:40] not in log.read_text()
    gaps = [b - a for a, b in zip(disturbed["times"], disturbed["times"][1:]) if b > stopped_at]
    print(f"\nstalled at chunk {chunks_at_stop}; owner epoch 2 after {taken_over_at - stopped_at:.2f}s; longest "
          f"silence {max(gaps):.2f}s; woke {woke_at - stopped_at:.1f}s after the stop; "
          f"{len(seqs)} events, each published once")
    assert max(gaps) < 8, f"the stream was silent for {max(gaps):.1f}s after the stall"


def _identity(data: bytes) -> tuple[str, int, str]:
    event = codec.decode_event(data)
    return event.id, event.seq, type(event).__name__
