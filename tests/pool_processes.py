"""Real-process warm pools for the node agent's tests and the pool bench: a redis-server, node agents and
gateways as processes, with a catalogue of SmolLM2, a copy of it under another id, and a corrupt file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llmfleet.redis_server import BundledRedis, free_port

POOL_ENV = {"LLMFLEET_SLOTS": "2", "LLMFLEET_KV_BUDGET_MIB": "32", "LLMFLEET_REGISTRY_CACHE_S": "0",
            "LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5", "LLMFLEET_HEARTBEAT_TTL_S": "3", "LLMFLEET_LEASE_S": "4",
            "LLMFLEET_THREADS": "1", "LLMFLEET_DRAIN_TIMEOUT_S": "30", "LLMFLEET_POOL_FAILURE_TTL_S": "60",
            "LLMFLEET_LOG_LEVEL": "INFO", "OPENBLAS_NUM_THREADS": "1"}


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll predicate until it holds, or fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def catalogue_files(smollm2: Path, folder: Path) -> list[str]:
    """`--model` entries: SmolLM2 by alias, a copy of its file as `second`, a truncated copy as `broken`."""
    second, broken = folder / "second.gguf", folder / "broken.gguf"
    if not second.exists():
        shutil.copyfile(smollm2, second)
        broken.write_bytes(smollm2.read_bytes()[:1_000_000])
    return ["smollm2-135m", f"second={second}", f"broken={broken}"]


@dataclass
class PoolCluster:
    """Redis, node agents and gateways; stop() ends them all."""

    folder: Path
    redis: BundledRedis
    env: dict[str, str]
    gateways: list[str] = field(default_factory=list)  # base URLs
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    node_logs: list[Path] = field(default_factory=list)

    def start_node(self, entries: list[str], *extra: str) -> subprocess.Popen[bytes]:
        """A node agent (`llmfleet node`) with these catalogue entries."""
        log = self.folder / f"node-{len(self.node_logs)}.log"
        args = [a for entry in entries for a in ("--model", entry)]
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "llmfleet.cli", "node", *args, *extra], env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.node_logs.append(log)
        return proc

    def start_gateway(self) -> str:
        """A gateway; its base URL once it answers /ready with a node."""
        port = free_port()
        with (self.folder / f"gateway-{port}.log").open("wb") as out:
            self.procs.append(subprocess.Popen([sys.executable, "-m", "llmfleet.cli", "gateway", "--port", str(port)],
                                               env=self.env, stdout=out, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        self.gateways.append(base)
        return base

    def wait_ready(self, nodes: int) -> None:
        """Until every gateway sees `nodes` node agents."""
        for base in self.gateways:
            wait_until(lambda b=base: _ready(b).get("nodes") == nodes, 120, f"{nodes} nodes at {base}")

    def loads(self, model: str) -> int:
        """How many workers of `model` the node agents started (from their logs)."""
        return sum(log.read_text(errors="replace").count(f"started worker-{model}-") for log in self.node_logs)

    def status(self, model: str, base: str | None = None) -> dict:
        """The model's /admin/models entry."""
        data = httpx.get((base or self.gateways[0]) + "/admin/models", timeout=10).json()["data"]
        return next(m for m in data if m["id"] == model)

    def stop(self) -> None:
        """SIGTERM everything (nodes drain their workers), SIGKILL what is left, stop Redis."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.redis.stop()


def start_pool(folder: Path, **settings: str) -> PoolCluster:
    """Redis and the environment of a pool cluster (start nodes and gateways on it)."""
    server = BundledRedis().start()
    env = {**os.environ, **POOL_ENV, "REDIS_URL": server.url, **settings}
    return PoolCluster(folder, server, env)


def _ready(base_url: str) -> dict:
    try:
        return httpx.get(base_url + "/ready", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {}
