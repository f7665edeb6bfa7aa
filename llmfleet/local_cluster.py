"""A cluster on this machine as processes: a Redis (the bundled redis-server, or one given by URL) and
gateways, workers, node agents and batch runners (`python -m llmfleet.cli <role>`) sharing one environment,
each logging to its own file; close() stops them all.

The process clusters of the tests (tests/support) and of the benchmarks (bench/) are built with it: both may
import the llmfleet package, while bench/ must not import tests/. `llmfleet serve` has its own supervisor
(llmfleet/supervisor.py), which also restarts what dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from llmfleet.redis_server import BundledRedis, free_port
from shared import keys

PY = sys.executable
CLI = [PY, "-m", "llmfleet.cli"]


def cli(*args: str) -> list[str]:
    """The command line of `llmfleet <args>` run by this interpreter."""
    return [*CLI, *args]


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, *,
               procs: Iterable[subprocess.Popen[bytes]] = (), interval_s: float = 0.1) -> None:
    """Poll `predicate` until it holds; TimeoutError naming what was awaited, or RuntimeError as soon as one of
    `procs` has exited meanwhile (a process that died at start-up is not waited for)."""
    procs = list(procs)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a process exited while waiting for {what}: {dead}")
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def stop_all(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """SIGTERM every process still running (all at once, so they drain in parallel), then SIGKILL any still
    there after `grace_s`."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def http_status(url: str, timeout_s: float = 2.0) -> int:
    """The status of a GET, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def http_json(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """The JSON object a GET answers (a 503's body too), {} when nothing (or no JSON) answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except OSError:
        return {}
    with contextlib.suppress(ValueError):
        data = json.loads(body)
        return data if isinstance(data, dict) else {}
    return {}


def die_with_parent() -> None:
    """A preexec function: the child gets SIGTERM when the process that started it dies, however it dies
    (Linux prctl; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LocalCluster:
    """Redis and llmfleet processes with one environment (REDIS_URL, LLMFLEET_PORT and `settings`).

    `workers` and `logs` are the worker processes and their log files, by index (`start_worker(i)` starts
    worker i again, appending to its log); `gateways` the base URLs of the gateways started."""

    def __init__(self, logdir: Path, settings: Mapping[str, str] | None = None, *, redis_url: str | None = None,
                 model: str = "smollm2-135m", port: int | None = None, gateway_args: Iterable[str] = (),
                 tied_to_parent: bool = False, cwd: Path | None = None) -> None:
        self.logdir = Path(logdir)
        self.gateway_args = list(gateway_args)  # what start() starts the gateway with
        self.cwd = cwd  # the children's working directory (None: this process's)
        self.settings = dict(settings or {})
        self.redis = None if redis_url else BundledRedis()  # the bundled server, None when given a URL
        self._redis_url = redis_url
        self.model = model
        self.port = port or free_port()
        self.tied_to_parent = tied_to_parent  # children get SIGTERM if this process dies (benchmarks)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gateway: subprocess.Popen[bytes] | None = None  # the first gateway
        self.gateways: list[str] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.node_logs: list[Path] = []
        self._client: Any = None

    @property
    def redis_url(self) -> str:
        """redis:// URL of the cluster's Redis."""
        return self._redis_url or self.redis.url  # type: ignore[union-attr]

    @property
    def base_url(self) -> str:
        """The first gateway's base URL (http://127.0.0.1:<port>)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment every process of the cluster starts with."""
        return {**os.environ, "REDIS_URL": self.redis_url, "LLMFLEET_PORT": str(self.port), **self.settings}

    @property
    def client(self) -> Any:
        """A synchronous redis-py client of the cluster's Redis (bytes replies; a Redis Cluster client under
        REDIS_CLUSTER=1), closed by close()."""
        if self._client is None:
            import redis

            clustered = self.settings.get("REDIS_CLUSTER", os.environ.get("REDIS_CLUSTER", "0")) == "1"
            self._client = (redis.RedisCluster if clustered else redis.Redis).from_url(self.redis_url)
        return self._client

    def start_redis(self) -> LocalCluster:
        """Start the bundled Redis (RuntimeError when there is no redis-server); nothing when given a URL."""
        if self.redis is not None and self.redis.process is None:
            self.redis.start()
        return self

    def spawn(self, name: str, argv: list[str], *, env: Mapping[str, str] | None = None, log: Path | None = None,
              **popen: Any) -> subprocess.Popen[bytes]:
        """Start a command (`cli(...)` for an llmfleet role) with the cluster's environment plus `env`, its
        output appended to `log` (default <logdir>/<name>.log) unless `popen` redirects it."""
        self.logdir.mkdir(parents=True, exist_ok=True)
        if self.tied_to_parent:
            popen.setdefault("preexec_fn", die_with_parent)
        popen.setdefault("cwd", self.cwd)
        with (log or self.logdir / f"{name}.log").open("ab") as out:
            popen = {"stdout": out, "stderr": subprocess.STDOUT, **popen}
            proc = subprocess.Popen(argv, env={**self.env, **(env or {})}, **popen)
        self.procs.append(proc)
        return proc

    def start_gateway(self, *args: str, port: int | None = None, env: Mapping[str, str] | None = None) -> str:
        """A gateway on `port` (the cluster's for the first, a free one for the next) with extra arguments and
        settings; its base URL."""
        port = port or (free_port() if self.gateways else self.port)
        proc = self.spawn(f"gateway-{port}" if self.gateway else "gateway", cli("gateway", "--port", str(port), *args),
                          env=env)
        self.gateway = self.gateway or proc
        self.gateways.append(f"http://127.0.0.1:{port}")
        return self.gateways[-1]

    def start_worker(self, index: int | None = None, worker_id: str | None = None, *, model: str | None = None,
                     args: Iterable[str] = ()) -> subprocess.Popen[bytes]:
        """Start worker process `index` (the next one by default; again after it ended: its log is appended),
        serving `model` (the cluster's by default) under `worker_id` or a fresh id."""
        index = len(self.workers) if index is None else index
        proc = self.spawn(f"worker-{index}", cli("worker", "--model", model or self.model, *args,
                                                 *(["--worker-id", worker_id] if worker_id else [])))
        if index < len(self.workers):
            self.workers[index] = proc
        else:
            self.workers.append(proc)
            self.logs.append(self.logdir / f"worker-{index}.log")
        return proc

    def start_node(self, entries: list[str], *extra: str) -> subprocess.Popen[bytes]:
        """A node agent (`llmfleet node`) with these catalogue entries."""
        name = f"node-{len(self.node_logs)}"
        proc = self.spawn(name, cli("node", *(a for entry in entries for a in ("--model", entry)), *extra))
        self.node_logs.append(self.logdir / f"{name}.log")
        return proc

    def start(self, workers: int = 0, *, worker_ids: list[str] | None = None, timeout_s: float = 240) -> LocalCluster:
        """Redis, a gateway (with `gateway_args`) and `workers` workers; returns once the gateway counts them all
        live."""
        self.start_redis()
        self.start_gateway(*self.gateway_args)
        for index in range(workers):
            self.start_worker(index, worker_ids[index] if worker_ids else None)
        self.wait_ready(workers, timeout_s=timeout_s)
        return self

    def ready(self, base_url: str | None = None) -> dict[str, Any]:
        """A gateway's /ready body ({} when it does not answer)."""
        return http_json((base_url or self.base_url) + "/ready")

    def wait_ready(self, workers: int | None = None, *, nodes: int | None = None, timeout_s: float = 240) -> None:
        """Until every gateway answers /ready with `workers` live workers (or `nodes` node agents), failing
        early if a process of the cluster exits; with neither, until it answers /health."""
        for base in self.gateways:
            if workers is None and nodes is None:
                check = lambda b=base: http_status(b + "/health") == 200  # noqa: E731
            else:
                check = lambda b=base: all(  # noqa: E731
                    want is None or self.ready(b).get(field) == want
                    for field, want in (("workers", workers), ("nodes", nodes)))
            wait_until(check, timeout_s, f"the cluster at {base} (logs in {self.logdir})", procs=self.procs,
                       interval_s=0.2)

    def worker_index(self, worker_id: str) -> int:
        """Which worker process registered as `worker_id` (from its start-up log line)."""
        for index, log in enumerate(self.logs):
            if f"worker {worker_id} serving" in log.read_text(errors="replace"):
                return index
        raise LookupError(f"no worker process logged the id {worker_id}")

    def worker_entries(self) -> list[dict[bytes, bytes]]:
        """The registry hashes of the workers in the workers index (bytes fields)."""
        ids = self.client.zrange(keys.WORKERS_INDEX, 0, -1)
        return [e for e in (self.client.hgetall(keys.worker_key(i.decode())) for i in ids) if e]

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
        """SIGTERM one process (workers drain and deregister), SIGKILL after the grace period."""
        stop_all([proc], grace_s)
        if proc in self.procs:
            self.procs.remove(proc)

    def close(self, grace_s: float = 30.0) -> None:
        """Stop every process (all at once: they drain in parallel), then Redis."""
        stop_all(self.procs, grace_s)
        if self._client is not None:
            self._client.close()
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
