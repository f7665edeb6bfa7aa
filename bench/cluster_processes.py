"""The processes a cluster benchmark starts (Redis, gateway, workers, stand-in), all stopped on exit: a
LocalCluster (llmfleet/local_cluster.py, which the tests' clusters use too) whose children die with the
benchmark, plus waiting for a model to be served."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from llmfleet.local_cluster import PY, LocalCluster, die_with_parent, http_status, wait_until

__all__ = ["PY", "Cluster", "die_with_parent", "http_status", "wait_until"]
BENCH_DIR = Path(__file__).resolve().parent


class Cluster(LocalCluster):
    """The bundled Redis, one gateway (with the benchmark's queue limit) and the workers this benchmark
    started; close() ends them all, and each gets SIGTERM if the benchmark process dies."""

    def __init__(self, logdir: Path, queue_limit: int) -> None:
        super().__init__(logdir, gateway_args=["--queue-limit", str(queue_limit)], tied_to_parent=True,
                         cwd=BENCH_DIR.parent)
        self.queue_limit = queue_limit

    @property
    def url(self) -> str:
        """The gateway's /v1 base URL."""
        return self.base_url + "/v1"

    def wait_model(self, model: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Wait until /ready is 200 and /v1/models lists `model` (its worker is registered and live)."""

        def listed() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{model} worker exited with code {proc.returncode}; see {self.logdir}")
            if http_status(self.base_url + "/ready") != 200:
                return False
            with urllib.request.urlopen(self.url + "/models", timeout=5) as response:
                return any(m["id"] == model for m in json.load(response)["data"])

        wait_until(listed, timeout_s, f"a live {model} worker", interval_s=0.25)
