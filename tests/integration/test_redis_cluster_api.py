"""llmfleet on a 3-primary Redis Cluster of processes (REDIS_CLUSTER=1, REDIS_URL naming one node): a gateway and
workers of two models, whose hash tags land on different primaries, serve the unmodified openai client streamed
and not; a stream the client leaves is cancelled on its worker; kill -9 of the worker holding a stream is invisible
to its client (another takes it over from the journal); each request's journal lives in its model's slot, on the
primary that owns it; the Batches API says it is not available on a cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
from redis.cluster import key_slot

from llmfleet.local_cluster import LocalCluster
from shared import keys
from tests.faults.process_cluster import stream_through_a_kill
from tests.support.cluster import MODEL, start_process_cluster
from tests.support.cluster_bed import SLOTS, ClusterBed, sharded_bed
from tests.support.openai_streams import stream_completion

pytestmark = [pytest.mark.slow, pytest.mark.integration]
CANDIDATES = ("smollm2-b", "smollm2-c", "smollm2-d", "smollm2-e", "smollm2-f")


def _primary(bed: ClusterBed, model: str) -> int:
    """Which of the bed's primaries owns a model's slot (the bed gives each a third of the slots, in order)."""
    return key_slot(keys.jobs_stream(model).encode()) * len(bed.ports) // SLOTS


@pytest.fixture(scope="module")
def fleet(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, str]]:
    """The cluster bed, a gateway, two workers of MODEL and one of a second name for the same file whose slot is
    on another primary; (the process cluster, the second model's name)."""
    with sharded_bed() as bed:
        yield from _fleet(bed, smollm2_gguf_path, tmp_path_factory.mktemp("redis-cluster"))


def _fleet(bed: ClusterBed, gguf: Path, logdir: Path) -> Iterator[tuple[LocalCluster, str]]:
    """A gateway, two workers of MODEL and one of a second name for the same file on another primary."""
    other = next(name for name in CANDIDATES if _primary(bed, name) != _primary(bed, MODEL))
    (logdir / f"{other}.gguf").symlink_to(gguf)
    # info logs kept: stream_through_a_kill finds its victim by the worker's start-up line
    cluster = start_process_cluster(logdir, 2, redis_url=f"redis://127.0.0.1:{bed.ports[0]}", REDIS_CLUSTER="1",
                                    LLMFLEET_HOST="127.0.0.1", LLMFLEET_HEARTBEAT_INTERVAL_S="0.5",
                                    LLMFLEET_HEARTBEAT_TTL_S="2", LLMFLEET_LEASE_S="30", LLMFLEET_ORPHAN_GRACE_S="1")
    try:
        cluster.start_worker(model=str(logdir / f"{other}.gguf"))
        cluster.wait_ready(3)
        yield cluster, other
    finally:
        cluster.close()


@pytest.fixture
def client(fleet: tuple[LocalCluster, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet[0].base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_both_models_answer_streamed_and_not(fleet: tuple[LocalCluster, str], client: openai.OpenAI) -> None:
    cluster, other = fleet
    for model in (MODEL, other):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                               max_tokens=8, temperature=0)
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        chunks = list(client.chat.completions.create(model=model, max_tokens=8, temperature=0, stream=True,
                                                     messages=[{"role": "user", "content": "Say hello."}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == reply.choices[0].message.content  # greedy: the same answer over pub/sub as collected
        assert chunks[-1].choices[0].finish_reason == "length"


def test_a_requests_journal_lives_in_its_models_slot(fleet: tuple[LocalCluster, str], client: openai.OpenAI) -> None:
    cluster, other = fleet
    client.completions.create(model=other, prompt="One, two,", max_tokens=4, temperature=0)
    journals = [key for node in cluster.client.get_primaries()
                for key in cluster.client.scan_iter(f"llmfleet:{{{other}}}:journal:*", target_nodes=node)]
    assert journals, "the request left no journal"
    assert {key_slot(key) for key in journals} == {key_slot(keys.jobs_stream(other).encode())}
    owners = {cluster.client.get_node_from_key(key).name for key in journals}
    assert owners == {cluster.client.get_node_from_key(keys.jobs_stream(other)).name}
    assert owners != {cluster.client.get_node_from_key(keys.jobs_stream(MODEL)).name}


def test_a_stream_left_early_is_cancelled_on_its_worker(fleet: tuple[LocalCluster, str]) -> None:
    cluster, _ = fleet
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 1500, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", cluster.base_url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        assert [line for line, _ in zip(resp.iter_lines(), range(6)) if line.startswith("data:")]
        busy_by = time.monotonic() + 10  # the next heartbeat reports the slot in use
        while sum(int(e.get(b"load", 0)) for e in cluster.worker_entries()) < 1:
            assert time.monotonic() < busy_by, "no worker reported the stream's slot as busy"
            time.sleep(0.1)
    node = cluster.client.get_node_from_key(keys.jobs_stream(MODEL))
    deadline = time.monotonic() + 10  # the orphan grace (1 s), the cancel over sharded pub/sub, a heartbeat;
    while time.monotonic() < deadline:  # 1,500 tokens would take SmolLM2 on one thread longer than that
        entries = cluster.worker_entries()
        idle = len(entries) == 3 and sum(int(e.get(b"load", 0)) for e in entries) == 0
        if idle and list(cluster.client.scan_iter(f"llmfleet:{{{MODEL}}}:cancelled:*", target_nodes=node)):
            return
        time.sleep(0.25)
    raise AssertionError(f"no cancel ended the stream the client left: {cluster.worker_entries()}, "
                         f"{sorted(cluster.client.scan_iter(f'llmfleet:{{{MODEL}}}:*', target_nodes=node))}")


def test_the_batches_api_is_refused_on_a_cluster(fleet: tuple[LocalCluster, str]) -> None:
    response = httpx.get(fleet[0].base_url + "/v1/batches", timeout=30)
    assert response.status_code == 501
    assert response.json()["error"]["code"] == "batches_unavailable"


def test_the_cluster_client_is_a_cluster_client(fleet: tuple[LocalCluster, str]) -> None:
    assert isinstance(fleet[0].client, redis.RedisCluster)  # the checks above read every primary, not one node


def _stream(base: str, result: dict[str, object]) -> None:
    stream_completion(base, result, "A long story about a lighthouse keeper:", 100)


def test_kill_9_of_the_worker_holding_a_stream_is_invisible(fleet: tuple[LocalCluster, str]) -> None:
    undisturbed, disturbed, killed_at = stream_through_a_kill(fleet[0], _stream)
    assert disturbed["text"] == undisturbed["text"]  # resumed from the journal in the model's slot, byte for byte
    times = disturbed["times"]
    gaps = [b - a for a, b in zip(times, times[1:]) if b > killed_at]  # type: ignore[operator]
    assert max(gaps, default=0) < 6, f"the stream was silent for {max(gaps):.1f}s"
