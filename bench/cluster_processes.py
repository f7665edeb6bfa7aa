"""The processes a cluster benchmark starts (Redis, gateway, workers, stand-in), all stopped on exit."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from llmfleet.redis_server import BundledRedis, free_port

PY = sys.executable
BENCH_DIR = Path(__file__).resolve().parent




class Cluster:
    """The bundled Redis, one gateway and the workers this benchmark started; close() ends them all."""

    def __init__(self, logdir: Path, queue_limit: int) -> None:
        self.logdir = logdir
        self.queue_limit = queue_limit
        self.redis = BundledRedis()
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gateway: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The gateway's /v1 base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Cluster:
        """Start Redis and the gateway (the gateway needs no worker to come up)."""
        self.redis.start()
        self.gateway = self.spawn("gateway", [PY, "-m", "llmfleet.cli", "gateway", "--port", str(self.port),
                                              "--queue-limit", str(self.queue_limit)])
        wait_until(lambda: http_status(f"http://127.0.0.1:{self.port}/health") == 200, 30, "gateway /health")
        return self

    def spawn(self, name: str, argv: list[str], **popen: object) -> subprocess.Popen[bytes]:
        """Start a child with REDIS_URL set (output in a log file unless given), ended if this process dies."""
        env = {**os.environ, "REDIS_URL": self.redis.url}
        with open(self.logdir / f"{name}.log", "ab") as log:
            popen = {"stdout": log, "stderr": subprocess.STDOUT, **popen}
            proc = subprocess.Popen(argv, env=env, cwd=BENCH_DIR.parent, preexec_fn=_die_with_parent, **popen)  # type: ignore[call-overload]
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
        """SIGTERM (workers drain and deregister), then SIGKILL after the grace period."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.procs:
            self.procs.remove(proc)

    def wait_model(self, model: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Wait until /ready is 200 and /v1/models lists `model` (its worker is registered and live)."""

        def listed() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{model} worker exited with code {proc.returncode}; see {self.logdir}")
            if http_status(self.url.removesuffix("/v1") + "/ready") != 200:
                return False
            with urllib.request.urlopen(self.url + "/models", timeout=5) as response:
                return any(m["id"] == model for m in json.load(response)["data"])

        wait_until(listed, timeout_s, f"a live {model} worker")

    def close(self) -> None:
        """Stop every child (workers first, gateway last) and Redis."""
        for proc in [p for p in self.procs if p is not self.gateway] + ([self.gateway] if self.gateway else []):
            self.stop(proc, grace_s=10.0)
        self.redis.stop()


def _die_with_parent() -> None:
    """In the child: SIGTERM when the benchmark process dies, however it dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def http_status(url: str) -> int:
    """The status of a GET, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def wait_until(check: object, timeout_s: float, what: str) -> None:
    """Poll `check()` every 0.25 s until it is true; RuntimeError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


