"""The warm pool on real processes: a redis-server, one `llmfleet node --max-loaded 1` with SmolLM2, a copy
of it as `second` and a truncated file as `broken`, and a gateway, driven by the unmodified openai client."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis

from llmfleet.node import SETTLE_S
from shared import codec, keys
from shared.messages import DoneEvent, ErrorEvent, GenerateJob, Sampling
from tests.support.processes import wait_until
from tests.support.warm_pool import REFUSED_TENSOR, PoolCluster, catalogue_files, start_pool

pytestmark = [pytest.mark.slow, pytest.mark.integration]
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def pool(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolCluster]:
    """One node agent (at most one model loaded) and one gateway; stopped afterwards."""
    folder = tmp_path_factory.mktemp("pool")
    try:
        cluster = start_pool(folder)
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    try:
        cluster.start_node(catalogue_files(smollm2_gguf_path, folder), "--max-loaded", "1")
        cluster.start_gateway()
        cluster.wait_ready(nodes=1)
        yield cluster
    finally:
        cluster.close()


def _client(pool: PoolCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=pool.gateways[0] + "/v1", api_key="unused", max_retries=0, timeout=300)


def _complete(pool: PoolCluster, model: str, **extra: object) -> str:
    """A short greedy completion of `model`; a failure (a request that never ended among them) shows the logs."""
    try:
        reply = _client(pool).completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                                 temperature=0, **extra)
    except openai.APIError as exc:
        raise AssertionError(f"{model}: {exc!r}\n{pool.log_tails()}") from exc
    return reply.choices[0].text


def test_every_catalogued_model_is_listed_with_whether_it_is_loaded(pool: PoolCluster) -> None:
    listed = {m.id: m for m in _client(pool).models.list().data}
    assert {"smollm2-135m", "second", "broken"} <= set(listed)
    assert all(isinstance(m.model_extra.get("loaded"), bool) for m in listed.values())
    assert _client(pool).models.retrieve("second").id == "second"


def test_alternate_requests_load_serve_and_evict(pool: PoolCluster) -> None:
    before = {m: pool.loads(m) for m in ("smollm2-135m", "second")}
    first = _complete(pool, "smollm2-135m")
    assert pool.status("smollm2-135m")["status"] == "ready"
    assert _complete(pool, "second") == first  # the same weights under another id: the same greedy text
    assert pool.status("second")["status"] == "ready"
    wait_until(lambda: pool.status("smollm2-135m")["status"] == "unloaded", 30, "smollm2 to be evicted")
    assert _complete(pool, "smollm2-135m") == first
    wait_until(lambda: pool.status("second")["status"] == "unloaded", 30, "second to be evicted")
    loaded = {m.id for m in _client(pool).models.list().data if m.model_extra["loaded"]}
    assert loaded == {"smollm2-135m"}
    assert pool.loads("second") - before["second"] == 1
    assert pool.loads("smollm2-135m") - before["smollm2-135m"] in (1, 2)  # 1 if it was loaded already
    status = pool.status("smollm2-135m")
    assert status["replicas"] == 1 and status["memory_bytes"] > 128 * 2**20 and status["last_used"] > 0
    assert "evicted (least recently used) to load second" in pool.node_logs[0].read_text()


def test_a_model_with_an_open_stream_is_never_evicted(pool: PoolCluster) -> None:
    _complete(pool, "smollm2-135m")  # loaded (and the only one: --max-loaded 1)
    got: dict[str, object] = {"tokens": 0}
    first_token = threading.Event()

    def stream() -> None:
        for chunk in _client(pool).completions.create(model="smollm2-135m", prompt="A long story:", max_tokens=120,
                                                      temperature=0, stream=True, extra_body={"ignore_eos": True}):
            got["tokens"] = int(got["tokens"]) + 1  # type: ignore[call-overload]
            first_token.set()
            got["finish"] = chunk.choices[0].finish_reason or got.get("finish")
        got["ended"], got["ended_wall"] = time.monotonic(), time.time()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert first_token.wait(120)
    waited = _complete(pool, "second")  # waits for the stream: its model is busy, so it is not evicted
    served = time.monotonic()
    streamer.join(120)
    assert got["finish"] == "length" and int(got["tokens"]) >= 120  # type: ignore[call-overload]
    assert served >= got["ended"]  # type: ignore[operator]
    assert waited
    evictions = [_log_time(line) for line in pool.node_logs[0].read_text().splitlines()
                 if "evicted (least recently used) to load second" in line]
    assert evictions and evictions[-1] >= float(got["ended_wall"]) - 0.5  # type: ignore[arg-type]


def _log_time(line: str) -> float:
    """The unix time of a log line's `2026-01-01 12:00:00,123` prefix (local time, as logging writes it)."""
    stamp, millis = line[:23].split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


@pytest.mark.parametrize("model, reason", [("broken", "broken.gguf"), ("refused", f"tensor {REFUSED_TENSOR}")])
def test_a_load_failure_ends_every_waiting_request_once_and_is_remembered(pool: PoolCluster, model: str,
                                                                          reason: str) -> None:
    base = pool.gateways[0]
    before = pool.loads(model)
    outcomes: list[tuple[int, str]] = []

    def request(stream: bool) -> None:
        body = {"model": model, "prompt": "hi", "max_tokens": 4, "stream": stream}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as response:
            outcomes.append((response.status_code, response.read().decode()))

    threads = [threading.Thread(target=request, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert len(outcomes) == 4
    for status, text in outcomes:
        assert text.count("model_load_failed") == 1, text  # the error, once
        if status == 200:  # a stream that had begun (": queued"): an error chunk, then [DONE]
            assert text.rstrip().endswith("data: [DONE]")
        else:
            assert status == 503 and json.loads(text)["error"]["code"] == "model_load_failed"
        assert "could not be loaded" in text and reason in text
    again = httpx.post(base + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 4})
    assert again.status_code == 503 and int(again.headers["retry-after"]) > 0  # remembered: no new load
    assert pool.status(model)["status"] == "failed"
    assert pool.loads(model) - before == 1
    assert any(reason in log.read_text(errors="replace") for log in pool.logdir.rglob("*.log"))  # the log line


def test_admin_unload_refuses_while_in_flight_and_force_drains(pool: PoolCluster) -> None:
    base = pool.gateways[0]
    loaded = httpx.post(base + "/admin/models/load", json={"model": "smollm2-135m"}, timeout=200)
    assert loaded.status_code == 200 and loaded.json()["status"] == "ready"
    got: dict[str, object] = {}
    started = threading.Event()

    def stream() -> None:
        for chunk in _client(pool).completions.create(model="smollm2-135m", prompt="Once", max_tokens=60,
                                                      temperature=0, stream=True, extra_body={"ignore_eos": True}):
            started.set()
            got["finish"] = chunk.choices[0].finish_reason or got.get("finish")

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert started.wait(120)
    refused = httpx.post(base + "/admin/models/unload", json={"model": "smollm2-135m"}, timeout=30)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_busy"
    forced = httpx.post(base + "/admin/models/unload", json={"model": "smollm2-135m", "force": True}, timeout=120)
    streamer.join(120)
    assert got["finish"] == "length"  # drained: the open stream finished
    assert forced.status_code == 200 and forced.json()["status"] == "unloaded"
    assert httpx.post(base + "/admin/models/unload", json={"model": "nope"}).status_code == 404


def test_keep_alive_zero_unloads_once_idle(pool: PoolCluster) -> None:
    assert _complete(pool, "second", extra_body={"keep_alive": 0})
    wait_until(lambda: pool.status("second")["status"] == "unloaded", 30, "second to unload")
    bad = httpx.post(pool.gateways[0] + "/v1/completions",
                     json={"model": "second", "prompt": "x", "keep_alive": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"
    assert _complete(pool, "second", extra_body={"keep_alive": "5m"})


def test_a_job_a_stopping_worker_read_loads_its_model_again(pool: PoolCluster) -> None:
    """The keep_alive-0 race made certain: the job arrives as the model unloads and the stopping worker's last
    blocking read takes it, so it is pending for a consumer with no registry entry and none waits. The node counts
    it as demand, loads the model again, and the new worker takes it over (before: nothing loaded, the request
    waited out its deadline in silence)."""
    assert _complete(pool, "second", extra_body={"keep_alive": 0})
    wait_until(lambda: pool.status("second")["status"] == "unloaded", 30, "second to unload")
    client = Redis.from_url(pool.redis_url)
    wait_until(lambda: not any(client.hget(k, "model") == b"second" for k in client.keys(keys.worker_key("*"))),
               30, "second's worker to deregister")
    now, stream = time.time(), keys.jobs_stream("second")
    job = GenerateJob(id="req-read-as-it-stopped", model="second", created=now, deadline=now + 240,
                      prompt="The capital of France is", max_tokens=4, sampling=Sampling(temperature=0))
    pipe = client.pipeline(transaction=True)  # written and read at once: the node never sees it waiting
    pipe.xadd(stream, {keys.JOB_FIELD: codec.encode_job(job)})
    pipe.xreadgroup(keys.JOBS_GROUP, "second-worker-that-stopped", {stream: ">"}, count=1)
    assert pipe.execute()[1]

    def events() -> list:
        return [codec.decode_event(f[keys.JOURNAL_EVENT_FIELD.encode()])
                for _id, f in client.xrange(keys.journal_stream(job.model, job.id))]

    wait_until(lambda: any(isinstance(e, DoneEvent | ErrorEvent) for e in events()), 120,
               f"the job to be served\n{pool.log_tails()}")
    assert isinstance(events()[-1], DoneEvent) and not any(isinstance(e, ErrorEvent) for e in events())
    assert _complete(pool, "second", extra_body={"keep_alive": "5m"})


def test_a_killed_worker_is_restarted_by_its_node(pool: PoolCluster) -> None:
    _complete(pool, "second")
    pids = [int(line.split("(pid ")[1].rstrip(")\n")) for line in pool.node_logs[0].read_text().splitlines()
            if "started worker-second-" in line]
    os.kill(pids[-1], signal.SIGKILL)
    wait_until(lambda: "restarting it in" in pool.node_logs[0].read_text(), 30, "the node to restart it")
    assert _complete(pool, "second")


@pytest.fixture()
def two_nodes(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[PoolCluster]:
    """Two node agents with the same catalogue (one model each at most) and two gateways (a long deadline: the
    burst that asks for a second replica must be admitted on a fresh, slow-measured worker)."""
    try:
        cluster = start_pool(tmp_path, LLMFLEET_REQUEST_TIMEOUT_S="3600")
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    try:
        entries = catalogue_files(smollm2_gguf_path, tmp_path)[:2]
        for _ in range(2):
            cluster.start_node(entries, "--max-loaded", "1")
        cluster.start_gateway()
        cluster.start_gateway()
        cluster.wait_ready(nodes=2)
        yield cluster
    finally:
        cluster.close()


def _burst(pool: PoolCluster, n: int, max_tokens: int) -> list[str]:
    """n concurrent completions of `second`, alternating between the gateways; their texts."""
    texts: list[str] = []

    def one(i: int) -> None:
        client = openai.OpenAI(base_url=pool.gateways[i % 2] + "/v1", api_key="unused", max_retries=0, timeout=300)
        reply = client.completions.create(model="second", prompt=f"Story {i}:", max_tokens=max_tokens, temperature=0,
                                          extra_body={"ignore_eos": True})
        texts.append(reply.choices[0].text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return texts


def test_two_gateways_asking_for_the_same_cold_model_cause_one_load(two_nodes: PoolCluster) -> None:
    assert len(_burst(two_nodes, 3, 4)) == 3
    assert two_nodes.loads("second") == 1 and two_nodes.status("second", two_nodes.gateways[1])["replicas"] == 1
    # a finished load keeps its claim SETTLE_S (no node loads again on a stale view): a burst inside that window
    # is served by the one replica, and a fast machine finishes it there (CI did)
    with Redis.from_url(two_nodes.redis_url) as redis:
        wait_until(lambda: not redis.exists(keys.pool_loading("second")), SETTLE_S + 10, "the load claim to lapse")
    assert len(_burst(two_nodes, 12, 48)) == 12  # a deep queue asks for a second replica, on the other node
    assert two_nodes.loads("second") == 2
    assert all("started worker-second-" in log.read_text() for log in two_nodes.node_logs)


def test_a_node_killed_by_sigkill_takes_its_workers_along_after_they_drain(smollm2_gguf_path: Path,
                                                                         tmp_path: Path) -> None:
    try:
        cluster = start_pool(tmp_path)
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    try:
        node = cluster.start_node(catalogue_files(smollm2_gguf_path, tmp_path)[:1])
        cluster.start_gateway()
        cluster.wait_ready(nodes=1)
        client = openai.OpenAI(base_url=cluster.gateways[0] + "/v1", api_key="unused", max_retries=0, timeout=300)
        stream = client.completions.create(model="smollm2-135m", prompt="Once", max_tokens=60, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        chunks = [next(iter(stream))]
        worker_pid = int(next(line.split("(pid ")[1].rstrip(")") for line in cluster.node_logs[0].read_text()
                              .splitlines() if "started worker-" in line))
        os.kill(node.pid, signal.SIGKILL)  # the worker gets SIGTERM (PR_SET_PDEATHSIG): it drains, then exits
        chunks += list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        wait_until(lambda: not Path(f"/proc/{worker_pid}").exists() or
                   Path(f"/proc/{worker_pid}/stat").read_text().split(")")[-1].split()[0] == "Z", 60,
                   "the worker to exit")
        wait_until(lambda: not any(m.id == "smollm2-135m" for m in client.models.list().data), 30,
                   "the dead node's catalogue to leave /v1/models")
    finally:
        cluster.close()
