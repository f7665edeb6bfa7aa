"""What the tests that start real processes share: stopping them all, however they ended."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable


def stop_all(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """SIGTERM every process still running (all at once, so they drain in parallel), then SIGKILL any still
    there after `grace_s`."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_serve(process: subprocess.Popen[bytes], grace_s: float = 90.0) -> None:
    """Ctrl-C a `llmfleet serve` started in its own process group (it drains), then kill the group if it is
    still there after `grace_s`."""
    import os
    import signal

    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
