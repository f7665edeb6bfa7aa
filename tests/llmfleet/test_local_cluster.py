"""llmfleet/local_cluster.py without models or Redis: waiting, spawning with the cluster's environment and
log files, and stopping whatever is left."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmfleet.local_cluster import LocalCluster, http_json, http_status, stop_all, wait_until


def test_wait_until_returns_times_out_or_stops_at_a_dead_process() -> None:
    calls: list[int] = []
    wait_until(lambda: calls.append(1) or len(calls) >= 3, 5, "three calls", interval_s=0.01)
    assert len(calls) == 3
    with pytest.raises(TimeoutError, match="waiting for never"):
        wait_until(lambda: False, 0.05, "never", interval_s=0.01)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited while waiting for the server"):
        wait_until(lambda: False, 30, "the server", procs=[dead])
    assert time.monotonic() - started < 5


def test_spawn_uses_the_cluster_environment_and_appends_to_its_log(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, {"LLMFLEET_SLOTS": "3"}, redis_url="redis://127.0.0.1:1/0", port=4321)
    code = "import os; print(os.environ['REDIS_URL'], os.environ['LLMFLEET_PORT'], os.environ['LLMFLEET_SLOTS'], " \
           "os.environ.get('EXTRA'))"
    for extra in ("one", "two"):
        cluster.spawn("probe", [sys.executable, "-c", code], env={"EXTRA": extra}).wait(timeout=30)
    assert (tmp_path / "probe.log").read_text().splitlines() == [
        "redis://127.0.0.1:1/0 4321 3 one", "redis://127.0.0.1:1/0 4321 3 two"]
    assert cluster.redis is None and cluster.base_url == "http://127.0.0.1:4321"


def test_close_stops_every_process_and_stop_all_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, redis_url="redis://127.0.0.1:1/0")
    sleeper = cluster.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    cluster.close(grace_s=10)
    assert sleeper.poll() is not None
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    stop_all([stubborn], grace_s=0.5)
    stubborn.stdout.close()
    assert stubborn.returncode == -9


def test_nothing_answering_reads_as_status_0_and_an_empty_body() -> None:
    assert http_status("http://127.0.0.1:1/health", timeout_s=0.5) == 0
    assert http_json("http://127.0.0.1:1/ready", timeout_s=0.5) == {}
