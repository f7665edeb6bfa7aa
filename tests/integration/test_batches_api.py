"""The batch API end to end with the official `openai` client: real Redis, gateway, SmolLM2 workers and a
`llmfleet batch-runner` process; outputs must equal the same requests made directly (greedy)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from llmfleet.local_cluster import LocalCluster
from shared import keys
from tests.support.batches import start_batch_runner
from tests.support.processes import stop_all, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
LEASE_S = 5  # short, so kill -9 recovery is quick; not so short that a CPU-starved runner loses its lease


def start_runner(cluster: LocalCluster, log: Path) -> subprocess.Popen[bytes]:
    """A `llmfleet batch-runner` process against the cluster's Redis."""
    return start_batch_runner(cluster, log, LLMFLEET_BATCH_CONCURRENCY="4", LLMFLEET_BATCH_LEASE_S=str(LEASE_S),
                              LLMFLEET_LOG_LEVEL="INFO", OPENBLAS_NUM_THREADS="1")


@pytest.fixture()
def runner_log(tmp_path: Path) -> Path:
    return tmp_path / "batch-runner.log"


@pytest.fixture()
def runner(cluster: Any, runner_log: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_runner(cluster, runner_log)
    yield proc
    stop_all([proc])


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?", "Say hello.",
             "What is Redis?", "Name a fruit.", "What is the largest ocean?", "Name a planet.",
             "What do bees make?", "What colour is the sky?", "Name a musical instrument.", "What is ice?",
             "Name a programming language.", "What is the opposite of hot?", "Name an animal.",
             "What is a verb?", "Name a month."]


def chat_body(question: str, max_tokens: int = 12) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0}


def twenty_requests() -> list[dict[str, Any]]:
    """17 chat completions and 2 completions, all greedy, then an embedding a generative model refuses (its
    workers run without LLMFLEET_CAUSAL_EMBEDDINGS): a 400 in the error file."""
    lines = [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(q)}
             for i, q in enumerate(QUESTIONS)]
    lines += [{"custom_id": f"text-{i}", "method": "POST", "url": "/v1/completions",
               "body": {"model": MODEL, "prompt": p, "max_tokens": 10, "temperature": 0}}
              for i, p in enumerate(["The capital of France is", "Once upon a time"])]
    lines.append({"custom_id": "embed-0", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": MODEL, "input": ["a batch of requests", "runs at low priority"]}})
    return lines


def upload(client: openai.OpenAI, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("input.jsonl", data), purpose="batch").id


def wait_for(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 400) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.5)
    raise AssertionError(f"batch {batch_id} did not reach {statuses}: {batch.status} {batch.request_counts}")


def direct(client: openai.OpenAI, line: dict[str, Any]) -> Any:
    """The reply to a line's request made directly."""
    if line["url"] == "/v1/chat/completions":
        return client.chat.completions.create(**line["body"])
    return client.completions.create(**line["body"])


def results(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    return {item["custom_id"]: item for item in map(json.loads, text.splitlines())}


def test_twenty_requests_complete_with_the_outputs_of_direct_requests(
        client: openai.OpenAI, runner: subprocess.Popen[bytes]) -> None:
    lines = twenty_requests()
    lines.append({"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": MODEL, "messages": "not a list", "temperature": 0}})
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"suite": "e2e"})
    assert batch.status == "validating" and batch.request_counts.total == 21 and batch.metadata == {"suite": "e2e"}
    assert batch.id in [b.id for b in client.batches.list(limit=5).data]
    done = wait_for(client, batch.id, ("completed", "failed", "expired", "cancelled"))
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (19, 2)
    assert done.in_progress_at and done.finalizing_at and done.completed_at >= done.created_at

    output = results(client, done.output_file_id)
    assert sorted(output) == sorted(line["custom_id"] for line in lines[:19])
    with ThreadPoolExecutor(4) as pool:  # the same requests made directly
        directs = list(pool.map(lambda line: direct(client, line), lines[:19]))
    for line, want in zip(lines[:19], directs):
        item = output[line["custom_id"]]
        assert item["error"] is None and item["response"]["status_code"] == 200 and item["id"].startswith("batch_req_")
        body = item["response"]["body"]
        if line["url"] == "/v1/chat/completions":
            assert body["object"] == "chat.completion" and body["model"] == MODEL
            assert body["choices"][0]["message"]["content"] == want.choices[0].message.content
            assert body["usage"]["completion_tokens"] == want.usage.completion_tokens
        else:
            assert body["choices"][0]["text"] == want.choices[0].text

    errors = results(client, done.error_file_id)
    assert sorted(errors) == ["bad-body", "embed-0"]
    response = errors["bad-body"]["response"]
    assert response["status_code"] == 400 and response["body"]["error"]["param"] == "messages"
    refused = errors["embed-0"]["response"]  # the worker's refusal, as the same request made directly gets it
    assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "model"
    assert f"'{MODEL}' is a generative model" in refused["body"]["error"]["message"]


def test_cancel_stops_a_running_batch(client: openai.OpenAI, runner: subprocess.Popen[bytes],
                                      cluster: Any) -> None:
    lines = [{"custom_id": f"long-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"Story number {i}:", "max_tokens": 200, "temperature": 0,
                       "ignore_eos": True}} for i in range(40)]
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/completions",
                                  completion_window="24h")
    wait_for(client, batch.id, ("in_progress",), timeout_s=60)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_for(client, batch.id, ("cancelled",), timeout_s=60)
    counts = done.request_counts
    assert counts.total == 40 and counts.completed < 40 and done.cancelled_at
    assert len(results(client, done.output_file_id)) == counts.completed
    assert not cluster.client.exists(keys.batch_output(batch.id))  # the results moved into the files
    assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling again changes nothing


def wait_completed(cluster: LocalCluster, batch_id: str, at_least: int) -> None:
    """Until the runner has recorded `at_least` lines (read in Redis: no lag behind a busy gateway)."""
    deadline = time.monotonic() + 120
    while int(cluster.client.hget(keys.batch_key(batch_id), "completed") or 0) < at_least:
        assert time.monotonic() < deadline, "the batch made no progress"
        time.sleep(0.05)


@contextmanager
def paused(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """The processes SIGSTOPped for the block, SIGCONTed after it however it ends."""
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)


def test_a_batch_survives_sigterm_then_kill_9_of_its_runners(client: openai.OpenAI, cluster: Any,
                                                             runner_log: Path) -> None:
    """SIGTERM: the runner puts the batch back in the queue (no attempt counted); kill -9: another runner
    resumes it after the lease. Lines done before are kept; every line ends up in the output once.

    The SIGTERM lands with the workers paused: the runner honours it at its next check (up to LEASE_S / 3
    later) and meanwhile goes on running lines, and under load it finished the batch first. Paused, no line can
    finish, so the batch is still running when the runner stops. Lines of 48 tokens, EOS ignored (a line's
    length is not up to the model), so that the kill -9 lands while lines remain (at 12 tokens the second
    runner finished the last 8 lines within 0.5 s of the 8th and the kill came after the batch completed)."""
    lines = [{"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {**chat_body(q, 48), "ignore_eos": True}} for i, q in enumerate(QUESTIONS[:16])]
    first = start_runner(cluster, runner_log)
    try:
        batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                      completion_window="24h")
        wait_completed(cluster, batch.id, 3)
        with paused([w for w in cluster.workers if w.poll() is None]):  # for less than their heartbeat TTL
            first.send_signal(signal.SIGTERM)
            wait_until(lambda: not cluster.client.exists(keys.batch_lease(batch.id)), 30,
                       "the SIGTERMed runner to leave the batch (it releases the lease)")
        assert first.wait(timeout=30) == 0
    finally:
        stop_all([first])
    stored = cluster.client.hgetall(keys.batch_key(batch.id))
    assert stored[b"status"] == b"in_progress" and stored[b"attempts"] == b"0"
    assert "stopped and requeued" in runner_log.read_text()
    done_by_first = int(stored[b"completed"])  # lines in flight at the SIGTERM may have finished: often 3 to 6
    second = start_runner(cluster, runner_log)
    try:
        wait_completed(cluster, batch.id, done_by_first + 2)  # the second runner has the batch: its kill matters
        second.send_signal(signal.SIGKILL)
        second.wait()
        before = client.batches.retrieve(batch.id)
        assert before.status == "in_progress" and before.request_counts.completed < 16
    finally:
        stop_all([second])
    third = start_runner(cluster, runner_log)
    try:
        done = wait_for(client, batch.id, ("completed", "failed"), timeout_s=240)
    finally:
        stop_all([third])
    assert done.status == "completed" and done.request_counts.completed == 16 and done.request_counts.failed == 0
    output = results(client, done.output_file_id)
    assert sorted(output) == sorted(line["custom_id"] for line in lines)
    assert "enqueued again (attempt 1)" in runner_log.read_text()
    assert cluster.client.hget(keys.batch_key(batch.id), "attempts") == b"1"  # the SIGTERM counted none
