"""Helpers of the fault tests: waiting, reading /ready, a running cluster's handles."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from llmfleet.redis_server import BundledRedis
from shared import keys

MODEL = "smollm2-135m"


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll predicate until it holds, or fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def heartbeat_loads(client: Any) -> dict[str, int]:
    """Each registered worker's load as its last heartbeat published it (every LLMFLEET_HEARTBEAT_INTERVAL_S)."""
    ids = [w.decode() for w in client.zrange(keys.WORKERS_INDEX, 0, -1)]
    return {w: int(client.hget(keys.worker_key(w), "load") or 0) for w in ids}


def ready(base_url: str) -> dict:
    """The gateway's /ready body ({} when it does not answer)."""
    try:
        return httpx.get(base_url + "/ready", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {}


@dataclass
class ProcessCluster:
    """A running cluster: its gateway URL, its Redis, its worker processes and their log files."""

    base_url: str
    redis: BundledRedis
    workers: list[subprocess.Popen[bytes]]
    logs: list[Path] = field(default_factory=list)  # one per worker, same order
    start_worker: Callable[..., subprocess.Popen[bytes]] | None = None  # (index, worker_id=None): (re)start one

    def worker_index(self, worker_id: str) -> int:
        """Which of the worker processes registered as `worker_id` (from its start-up log line)."""
        for index, log in enumerate(self.logs):
            if f"worker {worker_id} serving" in log.read_text(errors="replace"):
                return index
        raise LookupError(f"no worker process logged the id {worker_id}")
