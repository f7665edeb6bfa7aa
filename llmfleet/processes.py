"""Running the cluster's parts: one worker in this process, the gateway, or everything (`serve`)."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from shared import tracing
from shared.redis_target import RedisTarget
from shared.settings import Settings, SettingsError

if TYPE_CHECKING:
    from llmfleet.node import Node
    from llmfleet.supervisor import Supervisor

log = logging.getLogger("llmfleet")
WORKER_SWITCH_INTERVAL_S = 0.001  # a worker's other threads get the GIL within this much of the step's Python code


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives child processes the same settings (flags included)."""
    from shared.settings import ENV

    values = {name: getattr(settings, name) for name in ENV}
    return {ENV[name]: str(value) for name, value in values.items() if value is not None}


def configure_logging(level: str) -> None:
    """One log format for every llmfleet process (lengths and ids only, never prompt text)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def read_chat_template(path: str | None) -> str | None:
    """The jinja2 source of a configured chat-template file (None when none is configured)."""
    if not path:
        return None
    try:
        source = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"LLMFLEET_CHAT_TEMPLATE: cannot read {path} ({exc})") from None
    if not source.strip():
        raise SettingsError(f"LLMFLEET_CHAT_TEMPLATE: {path} is empty")
    return source


def run_worker(model_name: str, settings: Settings, *, served_as: str | None = None,
               worker_id: str | None = None) -> int:
    """Load the model and serve its job stream until SIGTERM/SIGINT, then drain and exit (a node agent names
    the model id it serves under and the worker's registry id)."""
    from threadpoolctl import threadpool_limits

    from worker.engine.engine import Engine
    from worker.engine.kernels.numba_runtime import set_threads
    from worker.models import model_id, resolve
    from worker.serve.redis_client import connect
    from worker.serve.runner import WorkerRunner

    if cluster_refused(settings):
        return 2
    threads = settings.threads or os.cpu_count() or 1
    blas_limits = threadpool_limits(limits=threads, user_api="blas")  # noqa: F841 (kept for the process's life)
    set_threads(threads)  # the compiled attention kernel's threads
    # the kernels release the GIL (numba_runtime.py), the step's Python between them holds it; the job feeder, the
    # publisher and the cancel listener each need it for every round trip, and at Python's default 5 ms a new job
    # reached the loop several such waits late
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL_S)
    path = resolve(model_name, progress=sys.stderr.isatty())
    started = time.monotonic()
    engine = Engine.load(path, chat_template=read_chat_template(settings.chat_template))
    log.info("loaded %s in %.1fs; %d BLAS threads", path.name, time.monotonic() - started, threads)
    client = connect(settings.redis_target)  # bounded sockets: worker/serve/redis_client.py
    tracing.configure("llmfleet-worker")  # OpenTelemetry, when OTEL_EXPORTER_OTLP_ENDPOINT is set
    runner = WorkerRunner(engine, client, settings, model=served_as or model_id(model_name), worker_id=worker_id,
                          model_file=path)

    def request_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: finishing in-flight requests, taking no new ones", signum)
        runner.stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    runner.run()
    return 0


def exposure_refused(settings: Settings) -> bool:
    """True (after printing why and what to do) when the gateway would serve the network with no API key and
    no setting says that is intended (gateway/http/exposure.py); logs the warning when it is intended."""
    from gateway.http.exposure import OpenEndpointRefused, check_exposure

    try:
        warning = check_exposure(settings)
    except OpenEndpointRefused as exc:
        print(f"llmfleet: {exc}", file=sys.stderr)
        return True
    if warning:
        log.warning(warning)
    return False


def cluster_refused(settings: Settings) -> bool:
    """True (after printing the one line why) when REDIS_CLUSTER is set and a node of the cluster is older than
    Redis 7.0 (no sharded pub/sub); an unreachable cluster is left to the process's own retries."""
    if not settings.redis_cluster:
        return False
    from redis.exceptions import RedisError

    from batches.redis_clients import cluster_version_problem, cluster_versions, sync_client

    try:
        client = sync_client(settings.redis_target, socket_connect_timeout=3)
        problem = cluster_version_problem(cluster_versions(client))
        client.close()
    except RedisError as exc:
        log.warning("could not read the Redis Cluster's versions (%s); starting anyway", type(exc).__name__)
        return False
    if problem:
        print(f"llmfleet: {problem}", file=sys.stderr)
    return problem is not None


def run_gateway(settings: Settings) -> int:
    """Serve the OpenAI-compatible HTTP API with uvicorn (refused, exit 2, when it would be open by accident or its
    Redis Cluster is too old)."""
    import uvicorn

    from gateway.app import create_app

    if exposure_refused(settings) or cluster_refused(settings):
        return 2
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=settings.log_level.lower(), timeout_graceful_shutdown=int(settings.drain_timeout_s))
    return 0


def run_batch_runner(settings: Settings) -> int:
    """Execute batches (an rq worker on the batch queue) and resume those whose runner died, until SIGTERM."""
    import threading

    import redis

    from batches import queue
    from batches.redis_clients import sync_client

    if settings.redis_cluster:
        print("llmfleet: the batch runner cannot run on a Redis Cluster (REDIS_CLUSTER=1): rq needs a single Redis; "
              "the gateways answer the Batches API with 501 there", file=sys.stderr)
        return 2
    connection = sync_client(settings.redis_target)  # sockets bounded; rq's BLPOP blocks less than they wait
    # a running batch sends rq heartbeats every third of its lease: the registration must outlive that
    worker = queue.batch_worker(connection, ttl_s=max(queue.WORKER_TTL_S, math.ceil(settings.batch_lease_s)),
                                settings=settings)

    def recover() -> None:
        """Every second: enqueue again the batches whose runner died."""
        scan = sync_client(settings.redis_target)
        suspects: dict[str, float] = {}
        while not worker.stopping.wait(1.0):
            try:
                queue.recover_orphans(scan, settings, suspects)
            except redis.RedisError as exc:
                log.warning("batch recovery scan failed: %s", type(exc).__name__)

    threading.Thread(target=recover, name="batch-recovery", daemon=True).start()
    log.info("batch runner %s started (concurrency %d)", worker.name, settings.batch_concurrency)
    worker.work(logging_level=settings.log_level)
    worker.stopping.set()
    return 0


def _http_ready(url: str) -> bool:
    """Whether the gateway's /ready answers 200 (a worker is registered)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/ready", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve(model_names: list[str], settings: Settings, *, workers: int, lazy: bool = False,
          catalogue_file: str | None = None, max_loaded: int | None = None) -> int:
    """Everything on one machine, supervised: Redis (bundled unless REDIS_URL is set), the gateway, and a node
    agent whose catalogue is the --model list (and the catalogue file); its models are loaded at once, N workers
    each, unless `lazy` (then on demand, as `llmfleet node`)."""
    import socket

    from llmfleet import catalogue as catalogues
    from llmfleet.redis_server import BundledRedis
    from shared import keys
    from worker.models import resolve

    if settings.redis_cluster and not os.environ.get("REDIS_URL"):  # the bundled server is not a cluster
        print("llmfleet: REDIS_CLUSTER=1 needs REDIS_URL naming a node of the cluster (serve's bundled Redis is "
              "a single server)", file=sys.stderr)
        return 2
    if exposure_refused(settings) or cluster_refused(settings):  # before anything starts: its gateway would refuse
        return 2
    entries = catalogues.build(model_names, catalogue_file)
    pinned = {} if lazy else {catalogues.parse_entry(name)[0]: workers for name in model_names}
    for model in pinned:
        resolve(entries[model], progress=True)  # pull once here, so the workers do not race for it
    status_key = keys.supervisor_status(f"{socket.gethostname()}:{settings.port}")
    settings = _split_cores(replace(settings, supervisor_key=status_key), workers * len(pinned) if pinned
                            else (max_loaded or settings.pool_max_loaded or 1))
    redis_server = None
    if not os.environ.get("REDIS_URL") and not settings.redis_target.sentinel:
        redis_server = BundledRedis().start()
        settings = replace(settings, redis_url=redis_server.url)
        log.info("started bundled redis-server on port %d", redis_server.port)
    alive = None if redis_server is None else (lambda: redis_server.process.poll() is None)
    supervisor = _supervisor(settings, entries, status_key, pinned=pinned, max_loaded=max_loaded, redis_alive=alive)
    for signum in (signal.SIGINT, signal.SIGTERM):  # also when started with SIGINT ignored (a background job)
        signal.signal(signum, supervisor.on_signal)
    try:
        return _supervise(supervisor, f"http://{settings.host}:{settings.port}", list(entries))
    finally:
        if redis_server is not None:
            redis_server.stop()


def _supervisor(settings: Settings, entries: dict[str, str], status_key: str, *, pinned: dict[str, int], max_loaded: int | None,
                redis_alive: Callable[[], bool] | None) -> Supervisor:
    """The gateway, the batch runner and the node agent as supervised children, with the status they report."""
    from llmfleet.child import Child
    from llmfleet.supervisor import STATUS_TTL_S, Supervisor

    env = {**os.environ, **settings_env(settings)}
    cli = [sys.executable, "-m", "llmfleet.cli"]
    gateway = Child("gateway", [*cli, "gateway"], env)
    batch_runner = Child("batch-runner", [*cli, "batch-runner"], env)
    node = _node(settings, entries, env, pinned=pinned, max_loaded=max_loaded)
    return Supervisor(gateway, [], batch_runner=batch_runner, drain_timeout_s=settings.drain_timeout_s,
                      redis_alive=redis_alive, node=node,
                      status=_status_writer(settings.redis_target, status_key, STATUS_TTL_S))


def _split_cores(settings: Settings, processes: int) -> Settings:
    """Unless LLMFLEET_THREADS is set, the machine's cores split among the worker processes (measured: see README)."""
    if settings.threads:
        return settings
    return replace(settings, threads=max(1, (os.cpu_count() or 1) // max(1, processes)))


def _supervise(supervisor: Supervisor, url: str, models: list[str]) -> int:
    """Start and run the supervised processes until a signal; drain them (a second signal kills them)."""
    code, forced = 0, False
    try:
        supervisor.start()
        code = supervisor.run(ready=lambda: _http_ready(url), on_ready=lambda: print(
            f"llmfleet is serving {', '.join(models)} at {url}/v1  (Ctrl-C drains and stops everything)", flush=True))
    except KeyboardInterrupt:  # a second signal
        forced, code = True, 130
    finally:
        if not forced:
            try:
                supervisor.stop()
            except KeyboardInterrupt:
                forced, code = True, 130
        if forced:
            supervisor.kill_all()
        log.info("serve stopped (exit %d)", code)
    return code


def _node(settings: Settings, entries: dict[str, str], env: dict[str, str], *, pinned: dict[str, int],
          max_loaded: int | None) -> Node:
    """A node agent over `entries` with the configured capacity and memory budget."""
    from llmfleet.catalogue import host_memory_bytes
    from llmfleet.node import Node
    from worker.serve.redis_client import connect

    budget = int(settings.pool_memory_mib * 1024 * 1024) if settings.pool_memory_mib else int(host_memory_bytes() * 0.8)
    client = connect(settings.redis_target)  # the workers' bounds (shared/redis_sockets.py); no blocking command
    return Node(client, settings, entries, env=env, pinned=pinned, memory_budget=budget,
                max_loaded=settings.pool_max_loaded if max_loaded is None else max_loaded)


def run_node(settings: Settings, entries: dict[str, str], *, max_loaded: int | None, eager: bool) -> int:
    """A node agent against REDIS_URL: load catalogued models on demand until SIGTERM/SIGINT, then drain."""
    from redis.exceptions import RedisError

    from llmfleet.node import TICK_S

    if cluster_refused(settings):
        return 2
    env = {**os.environ, **settings_env(settings)}
    node = _node(settings, entries, env, pinned={m: 1 for m in entries} if eager else {}, max_loaded=max_loaded)
    stopping: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        if stopping:
            raise KeyboardInterrupt
        log.info("signal %d: draining the node's workers, then stopping", signum)
        stopping.append(signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    log.info("node %s: catalogue %s, at most %s loaded, memory budget %.0f MiB", node.node_id, ", ".join(entries),
             node.max_loaded or "any number", node.memory_budget / 2**20)
    try:
        while not stopping:
            try:
                node.tick()
            except (RedisError, OSError) as exc:
                log.warning("the node's pool turn failed: %s", type(exc).__name__)
            time.sleep(TICK_S)
        node.stop(settings.drain_timeout_s + 5)
    except KeyboardInterrupt:
        for child in node.children:
            if child.running:
                os.killpg(child.process.pid, signal.SIGKILL)
        return 130
    return 0


def _status_writer(target: RedisTarget, key: str, ttl_s: int) -> Callable[[dict[str, object]], None]:
    """A function that stores the supervisor's state in Redis for /ready (with a TTL)."""
    from batches.redis_clients import sync_client

    client = sync_client(target, socket_connect_timeout=1, socket_timeout=1)

    def write(fields: dict[str, object]) -> None:
        pipe = client.pipeline(transaction=False)
        pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
        pipe.expire(key, ttl_s)
        pipe.execute()

    return write


def healthcheck(role: str, settings: Settings) -> int:
    """Exit 0 when this host's gateway answers /health, a worker on this host has a fresh heartbeat, or (batch-runner)
    an rq worker of this host serves the batch queue."""
    import socket
    import urllib.error
    import urllib.request

    if role == "gateway":
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{settings.port}/health", timeout=3) as response:
                return 0 if response.status == 200 else 1
        except (urllib.error.URLError, OSError):
            return 1
    from batches.redis_clients import sync_client
    from shared.redis_commands import fresh_workers, run

    client = sync_client(settings.redis_target, socket_connect_timeout=3)
    host, now = socket.gethostname(), time.time()
    if role == "batch-runner":  # an rq worker of this host registered on the batch queue
        from rq import Worker

        from batches.queue import batch_queue

        return 0 if any(w.hostname == host for w in Worker.all(queue=batch_queue(client))) else 1
    fresh = run(client, fresh_workers(now, settings.heartbeat_ttl_s))
    return 0 if any(entry.host == host for entry in fresh) else 1
