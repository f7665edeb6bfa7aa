"""What the tests that start real processes share: waiting, stopping (however the processes ended), and
`llmfleet serve` started and stopped in its own process group.

wait_until and stop_all are llmfleet/local_cluster.py's (the benchmarks use them too)."""

from __future__ import annotations

import os
import signal
import subprocess

from llmfleet.local_cluster import http_json, stop_all, wait_until

__all__ = ["http_json", "stop_all", "stop_serve", "wait_until"]


def stop_serve(process: subprocess.Popen[bytes], grace_s: float = 90.0) -> None:
    """Ctrl-C a `llmfleet serve` started in its own process group (it drains), then kill the group if it is
    still there after `grace_s`."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
