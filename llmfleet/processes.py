"""Running the cluster's parts: one worker in this process, the gateway, or everything (`serve`)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

from shared.settings import Settings

log = logging.getLogger("llmfleet")


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives child processes the same settings (flags included)."""
    from shared.settings import ENV

    values = {name: getattr(settings, name) for name in ENV}
    return {ENV[name]: str(value) for name, value in values.items() if value is not None}


def configure_logging(level: str) -> None:
    """One log format for every llmfleet process (lengths and ids only, never prompt text)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_worker(model_name: str, settings: Settings) -> int:
    """Load the model and serve its job stream until SIGTERM/SIGINT, then drain and exit."""
    import redis
    from threadpoolctl import threadpool_limits

    from worker.engine.engine import Engine
    from worker.models import model_id, resolve
    from worker.runner import WorkerRunner

    threads = settings.threads or os.cpu_count() or 1
    blas_limits = threadpool_limits(limits=threads, user_api="blas")  # noqa: F841 (kept for the process's life)
    path = resolve(model_name, progress=sys.stderr.isatty())
    started = time.monotonic()
    engine = Engine.load(path)
    log.info("loaded %s in %.1fs; %d BLAS threads", path.name, time.monotonic() - started, threads)
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=5, health_check_interval=30)
    runner = WorkerRunner(engine, client, settings, model=model_id(model_name))

    def request_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: finishing in-flight requests, taking no new ones", signum)
        runner.stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    runner.run()
    return 0


def run_gateway(settings: Settings) -> int:
    """Serve the OpenAI-compatible HTTP API with uvicorn."""
    import uvicorn

    from gateway.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=settings.log_level.lower(), timeout_graceful_shutdown=5)
    return 0


def _wait_http_ready(url: str, timeout_s: float, gateway: subprocess.Popen[bytes]) -> bool:
    """Poll /ready until it answers 200 (a worker is registered), the gateway dies, or time runs out."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and gateway.poll() is None:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def serve(model_name: str, settings: Settings, *, workers: int) -> int:
    """Everything on one machine: Redis (bundled unless REDIS_URL is set), the gateway and N workers."""
    from llmfleet.redis_server import BundledRedis
    from worker.models import resolve

    resolve(model_name, progress=True)  # pull once here, so the workers do not race for it
    redis_server = None
    env = dict(os.environ)
    if not os.environ.get("REDIS_URL"):
        redis_server = BundledRedis().start()
        settings = replace(settings, redis_url=redis_server.url)
        log.info("started bundled redis-server on port %d", redis_server.port)
    if not settings.threads:  # split the machine's cores among the workers (measured: see README)
        settings = replace(settings, threads=max(1, (os.cpu_count() or 1) // max(1, workers)))
    env.update(settings_env(settings))
    cli = [sys.executable, "-m", "llmfleet.cli"]
    children: list[subprocess.Popen[bytes]] = []
    try:
        gateway = subprocess.Popen([*cli, "gateway"], env=env)
        children.append(gateway)
        for _ in range(workers):
            children.append(subprocess.Popen([*cli, "worker", "--model", model_name], env=env))
        url = f"http://{settings.host}:{settings.port}"
        if _wait_http_ready(url, 300, gateway):
            print(f"llmfleet is serving {model_name} at {url}/v1  (Ctrl-C stops everything)", flush=True)
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        log.error("a child process exited; shutting everything down")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        _stop_children(children)
        if redis_server is not None:
            redis_server.stop()


def _stop_children(children: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """SIGTERM every child (workers drain), wait, then SIGKILL stragglers."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def healthcheck(role: str, settings: Settings) -> int:
    """Exit 0 when this host's gateway answers /health, or a worker on this host has a fresh heartbeat."""
    import socket
    import urllib.error
    import urllib.request

    if role == "gateway":
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{settings.port}/health", timeout=3) as response:
                return 0 if response.status == 200 else 1
        except (urllib.error.URLError, OSError):
            return 1
    import redis

    from shared import keys

    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=3)
    host, now = socket.gethostname(), time.time()
    for worker_id in client.zrangebyscore(keys.WORKERS_INDEX, now - settings.heartbeat_ttl_s, "+inf"):
        entry = client.hgetall(keys.worker_key(worker_id.decode()))
        if entry.get(b"host", b"").decode() == host and float(entry.get(b"heartbeat", 0)) >= now - settings.heartbeat_ttl_s:
            return 0
    return 1
