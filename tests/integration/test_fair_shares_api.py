"""Fair shares within a priority class, on a real cluster (Redis, gateway and worker processes): one tenant's
burst of many requests does not delay another tenant's single request, sent after the burst, even on a worker whose
one slot the burst holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from llmfleet.local_cluster import LocalCluster
from shared import keys
from tests.support.cluster import start_process_cluster
from tests.support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.slow, pytest.mark.integration]
BURST = 30
TOKENS = 64


@pytest.fixture(scope="module")
def tiny_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, str]]:
    """One worker of the tiny random model with one slot (so the burst queues), keys off; (cluster, model)."""
    logdir = tmp_path_factory.mktemp("fair-shares")
    model = write_tiny_gguf(logdir / "tiny-fair.gguf")
    running = start_process_cluster(logdir, 1, model=str(model), LLMFLEET_HOST="127.0.0.1", LLMFLEET_SLOTS="1",
                                    LLMFLEET_QUEUE_LIMIT="200", LLMFLEET_LOG_LEVEL="WARNING",
                                    LLMFLEET_REQUEST_TIMEOUT_S="3600")  # admission by work admits the whole burst
    try:
        yield running, model.stem
    finally:
        running.close()


def _complete(base: str, model: str, tenant: str, finished: list[str], name: str) -> None:
    """One completion of TOKENS tokens for `tenant` (the X-LLMFleet-Tenant header); its name is noted when done."""
    body = {"model": model, "prompt": "once upon a time", "max_tokens": TOKENS, "ignore_eos": True, "temperature": 0}
    reply = httpx.post(base + "/v1/completions", json=body, headers={"X-LLMFleet-Tenant": tenant}, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == TOKENS
    finished.append(name)


def test_a_burst_does_not_delay_another_tenants_single_request(tiny_cluster: tuple[LocalCluster, str]) -> None:
    cluster, model = tiny_cluster
    finished: list[str] = []
    burst = [threading.Thread(target=_complete, args=(cluster.base_url, model, "A", finished, f"a{i}"))
             for i in range(BURST)]
    for thread in burst:
        thread.start()
    queue = keys.fair_keys(model)[0]
    deadline = time.monotonic() + 60
    while cluster.client.zcard(queue) < BURST // 2 and time.monotonic() < deadline:  # the burst waits its turns
        time.sleep(0.01)
    single = threading.Thread(target=_complete, args=(cluster.base_url, model, "B", finished, "b"))
    sent = len(finished)
    single.start()
    single.join(timeout=120)
    for thread in burst:
        thread.join(timeout=120)
    assert len(finished) == BURST + 1
    assert BURST - sent >= 10, f"the burst was almost over ({sent} done) before B's request: nothing to overtake"
    # B is a newcomer to a saturated class: its job skips the queue (the class above's stream), preempts the one job
    # running and goes first (shared/fair_queue.py); only A's replies finished but not yet read by their threads
    # when B was sent can come before it (a margin of three on a busy machine). First in, first out
    # (LLMFLEET_FAIR_SHARES=0) it finishes after all of them.
    assert finished.index("b") - sent <= 3, (sent, finished)
    # the worker counted every job it took off its tenant (the stream entry's tenant field): none is left waiting
    assert cluster.client.hgetall(keys.fair_lane_keys(model)[0]) == {}
