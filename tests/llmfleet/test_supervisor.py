"""The supervisor's bookkeeping without processes: exit descriptions, backoff, the restart bound."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from llmfleet.child import Child, RestartPolicy, describe_exit
from llmfleet.supervisor import Supervisor


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL"


def test_backoff_doubles_and_the_bound_is_per_minute() -> None:
    policy = RestartPolicy(per_minute=3, first_s=0.5, max_s=1.5)
    assert [policy.next_delay(t) for t in (0.0, 1.0, 2.0)] == [0.5, 1.0, 1.5]
    assert policy.next_delay(3.0) is None  # a 4th restart within a minute: give up
    assert policy.next_delay(61.5) == 1.0  # the first two are older than a minute: one restart counts


def _exited_child(name: str, code: int) -> Child:
    child = Child(name, [sys.executable, "-c", f"raise SystemExit({code})"], {})
    child.process = subprocess.Popen(child.argv)
    child.process.wait()
    return child


def test_a_dead_worker_is_restarted_then_given_up_on() -> None:
    worker = _exited_child("worker-1", 7)
    worker.policy = RestartPolicy(per_minute=1, first_s=0.0)
    gateway = Child("gateway", [sys.executable, "-c", "import time; time.sleep(30)"], {})
    gateway.start()
    seen: list[dict[str, object]] = []
    sup = Supervisor(gateway, [worker], drain_timeout_s=1, status=seen.append)
    try:
        sup._check(worker, now=100.0)
        assert worker.restart_at == 100.0 and not worker.given_up
        sup._check(worker, now=100.0)  # due: restarted (it exits again at once)
        assert worker.restarts == 1
        worker.process.wait()
        sup._check(worker, now=101.0)
        assert worker.given_up  # the bound (1 a minute) is reached
        sup._publish_status()
        assert seen[-1]["workers_given_up"] == "worker-1" and seen[-1]["workers_running"] == 0
        assert gateway.running  # the rest goes on
    finally:
        sup.stop()
    assert not gateway.running


def test_second_signal_forces() -> None:
    sup = Supervisor(Child("gateway", ["true"], {}), [], drain_timeout_s=1)
    sup.on_signal(signal.SIGTERM, None)
    assert sup.stopping
    try:
        sup.on_signal(signal.SIGINT, None)
    except KeyboardInterrupt:
        return
    raise AssertionError("a second signal must force the stop")


def test_children_are_supervised_while_the_service_comes_up() -> None:
    """A worker that dies before the gateway is ready is restarted, not left a zombie."""
    worker = _exited_child("worker-1", 1)
    worker.policy = RestartPolicy(per_minute=1, first_s=0.0)
    gateway = Child("gateway", [sys.executable, "-c", "import time; time.sleep(30)"], {})
    gateway.start()
    sup = Supervisor(gateway, [worker], drain_timeout_s=1)
    checks = []

    def never_ready() -> bool:
        checks.append(1)
        if len(checks) > 3:
            sup.stopping = True
        return False

    try:
        assert sup.run(poll_s=0.01, ready=never_ready, on_ready=lambda: None) == 0
        assert worker.restarts == 1
    finally:
        sup.stop()


def test_children_are_stopped_when_serve_dies_by_kill_9(tmp_path) -> None:
    """A supervised child asks the kernel for SIGTERM when its parent dies, so kill -9 of serve orphans nothing."""
    import os
    import time

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from llmfleet.child import Child\n"
        "child = Child('worker-1', [sys.executable, '-c', 'import time; time.sleep(60)'], None)\n"
        "child.start()\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.process.pid))\n"
        "time.sleep(60)\n")])
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        stat = Path(f"/proc/{child_pid}/stat").read_text().split(")")[-1].split()[0]
        if stat == "Z":
            return
        time.sleep(0.05)
    raise AssertionError("the child outlived its killed parent")


def test_the_batch_runner_is_supervised_and_stopped_with_the_gateway() -> None:
    gateway = Child("gateway", [sys.executable, "-c", "import time; time.sleep(30)"], {})
    worker = Child("worker-1", [sys.executable, "-c", "import time; time.sleep(30)"], {})
    runner = _exited_child("batch-runner", 3)
    runner.policy = RestartPolicy(per_minute=5, first_s=0.0)
    sup = Supervisor(gateway, [worker], drain_timeout_s=1, batch_runner=runner)
    assert [c.name for c in sup.children] == ["gateway", "batch-runner", "worker-1"]
    gateway.start()
    worker.start()
    try:
        sup._check(runner, now=100.0)
        sup._check(runner, now=100.0)  # restarted like any other child
        assert runner.restarts == 1
    finally:
        sup.stop()
    assert not any(c.running for c in sup.children)
