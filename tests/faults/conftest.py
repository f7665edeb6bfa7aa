"""Real-process clusters for the fault tests: a redis-server, a gateway and SmolLM2 workers as processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from process_cluster import MODEL, ProcessCluster, ready, wait_until  # noqa: E402
from process_helpers import stop_all

from llmfleet.redis_server import BundledRedis, free_port  # noqa: E402


@pytest.fixture()
def start_cluster(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[Callable[..., ProcessCluster]]:
    """A factory: start Redis, a gateway and N workers (of `model`, SmolLM2 by default) with extra env settings;
    everything stops afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[BundledRedis] = []

    def start(workers: int, model: str = MODEL, worker_ids: list[str] | None = None,
              **settings: str) -> ProcessCluster:
        try:
            server = BundledRedis().start()
        except RuntimeError as exc:
            pytest.skip(f"no redis-server available: {exc}")
        servers.append(server)
        port = free_port()
        # float32 KV: the fault tests compare a resumed stream with an undisturbed run token for token, which a
        # float16 pool leaves to chance at near-ties (README, LLMFLEET_KV_DTYPE); what they check of the resume
        # itself (no token lost, repeated or out of order) does not depend on the dtype
        env = {**os.environ, "REDIS_URL": server.url, "LLMFLEET_PORT": str(port), "LLMFLEET_REGISTRY_CACHE_S": "0",
               "LLMFLEET_THREADS": "1", "LLMFLEET_KV_DTYPE": "float32", **settings}
        def spawn(name: str, args: list[str]) -> subprocess.Popen[bytes]:
            with (tmp_path / f"{name}.log").open("ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "llmfleet.cli", *args], env=env, stdout=log,
                                        stderr=subprocess.STDOUT)
            procs.append(proc)
            return proc

        def start_worker(index: int, worker_id: str | None = None) -> subprocess.Popen[bytes]:
            """Start worker process `index` (again), under `worker_id` or a fresh one; its log file is appended."""
            return spawn(f"worker-{index}", ["worker", "--model", model]
                         + (["--worker-id", worker_id] if worker_id else []))

        spawn("gateway", ["gateway"])
        started = [start_worker(i, worker_ids[i] if worker_ids else None) for i in range(workers)]
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: ready(base).get("workers") == workers, 240, "the cluster")
        return ProcessCluster(base, server, started, [tmp_path / f"worker-{i}.log" for i in range(workers)],
                              start_worker)

    try:
        yield start
    finally:
        stop_all(procs)
        for server in servers:
            server.stop()
