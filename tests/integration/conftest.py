"""The cluster as processes, as docker-compose runs it: one Redis, one gateway, two SmolLM2 workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from process_helpers import stop_all

from llmfleet.redis_server import BundledRedis, free_port
from shared import keys

MODEL = "smollm2-135m"
SLOTS = 4
QUEUE_LIMIT = 4


@dataclass
class Cluster:
    """Addresses and handles of a running test cluster."""

    base_url: str
    redis_url: str
    redis: redis.Redis
    workers: list[subprocess.Popen[bytes]]

    def worker_entries(self) -> list[dict[bytes, bytes]]:
        """The registry hashes of the live workers."""
        ids = self.redis.zrange(keys.WORKERS_INDEX, 0, -1)
        return [e for e in (self.redis.hgetall(keys.worker_key(i.decode())) for i in ids) if e]


def _wait(predicate, timeout_s: float, what: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a cluster process exited early: {dead}")
        if predicate():
            return
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def cluster(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Start Redis, `llmfleet gateway` and two `llmfleet worker` processes; stop them all afterwards."""
    import httpx

    try:
        server = BundledRedis().start()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    port = free_port()
    env = {**os.environ, "REDIS_URL": server.url, "LLMFLEET_PORT": str(port), "LLMFLEET_HOST": "127.0.0.1",
           "LLMFLEET_SLOTS": str(SLOTS), "LLMFLEET_QUEUE_LIMIT": str(QUEUE_LIMIT),
           "LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5", "LLMFLEET_HEARTBEAT_TTL_S": "5", "LLMFLEET_LEASE_S": "10",
           "LLMFLEET_REGISTRY_CACHE_S": "0", "LLMFLEET_LOG_LEVEL": "WARNING"}
    logs = tmp_path_factory.mktemp("cluster-logs")
    cli = [sys.executable, "-m", "llmfleet.cli"]
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = (logs / f"{name}.log").open("wb")
        proc = subprocess.Popen([*cli, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    client = redis.Redis.from_url(server.url)
    try:
        spawn("gateway", ["gateway"])
        workers = [spawn(f"worker{i}", ["worker", "--model", MODEL]) for i in range(2)]
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(base + "/ready", timeout=2).status_code == 200 and client.zcard(keys.WORKERS_INDEX) == 2
            except httpx.HTTPError:
                return False

        _wait(ready, 240, "the gateway and two workers", procs)
        yield Cluster(base_url=base, redis_url=server.url, redis=client, workers=workers)
    finally:
        stop_all(procs)
        server.stop()
