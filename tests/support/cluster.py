"""Process clusters for the tests: a bundled redis-server (or a given Redis), a gateway and N workers as
processes with env settings (llmfleet/local_cluster.py LocalCluster), or a test skipped saying why not."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from llmfleet.local_cluster import LocalCluster, cli, http_status, wait_until
from llmfleet.redis_server import free_port

MODEL = "smollm2-135m"
# every test cluster: workers visible at once (no registry cache), one thread per worker (CI's small boxes)
TEST_SETTINGS = {"LLMFLEET_REGISTRY_CACHE_S": "0", "LLMFLEET_THREADS": "1"}


def process_cluster_redis(logdir: Path, *, redis_url: str | None = None, model: str = MODEL,
                          **settings: str) -> LocalCluster:
    """A LocalCluster with TEST_SETTINGS and `settings` whose Redis runs (the bundled one unless `redis_url`),
    nothing else started yet; skips the test when there is no redis-server."""
    tier = {"LLMFLEET_KV_TIER_DIR": str(logdir / "kv-tier")}  # each cluster its own host tier, not /dev/shm's
    cluster = LocalCluster(logdir, {**TEST_SETTINGS, **tier, **settings}, model=model, redis_url=redis_url)
    try:
        return cluster.start_redis()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")


def start_process_cluster(logdir: Path, workers: int, *, model: str = MODEL, worker_ids: list[str] | None = None,
                          redis_url: str | None = None, timeout_s: float = 240, **settings: str) -> LocalCluster:
    """Redis (the bundled one unless `redis_url`), a gateway and `workers` workers of `model` with
    TEST_SETTINGS and `settings`, once the gateway counts them all live; the caller close()s it. Skips the
    test when there is no redis-server."""
    cluster = process_cluster_redis(logdir, redis_url=redis_url, model=model, **settings)
    try:
        return cluster.start(workers, worker_ids=worker_ids, timeout_s=timeout_s)
    except BaseException:
        cluster.close()
        raise


def start_extra_gateway(cluster: LocalCluster, log: Path, *, wait_for: str = "/health",
                        **settings: str) -> tuple[subprocess.Popen[bytes], str]:
    """Another gateway on the cluster's Redis, on a free port, with extra settings; (its process, its base URL)
    once `wait_for` answers 200. Stop it with cluster.stop(process)."""
    port = free_port()
    proc = cluster.spawn(log.stem, cli("gateway", "--port", str(port)), env=settings, log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_status(base + wait_for) == 200, 60, f"the gateway at {base} (log {log})", procs=[proc])
    except BaseException:
        cluster.stop(proc)
        raise
    return proc, base


@contextmanager
def serving_file_as(gguf: Path, name: str, logdir: Path) -> Iterator[LocalCluster]:
    """A one-worker cluster serving `gguf` under the model name `name` (a symlink `name`.gguf beside it in
    `logdir`), on localhost, warnings only; closed on exit."""
    model = logdir / f"{name}.gguf"
    if not model.exists():
        model.symlink_to(gguf)
    running = start_process_cluster(logdir, 1, model=str(model), LLMFLEET_HOST="127.0.0.1",
                                    LLMFLEET_LOG_LEVEL="WARNING")
    try:
        yield running
    finally:
        running.close()
