"""One supervised child process (of `serve` or of a node agent): how it starts, how its end reads in a log
line, and how fast it may be restarted."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("llmfleet.supervisor")

MAX_RESTARTS_PER_MINUTE = 5
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def parent_death_signal(parent_pid: int) -> Callable[[], None] | None:
    """A preexec function: the kernel sends the child SIGTERM when serve dies, even by kill -9 (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: the child does as little as possible
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # serve died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def describe_exit(returncode: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a Popen returncode."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class RestartPolicy:
    """Exponential backoff between restarts, and at most `per_minute` restarts in any 60 s."""

    per_minute: int = MAX_RESTARTS_PER_MINUTE
    first_s: float = BACKOFF_FIRST_S
    max_s: float = BACKOFF_MAX_S
    history: deque[float] = field(default_factory=deque)

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next restart, or None when the bound is reached (give up)."""
        while self.history and now - self.history[0] > 60.0:
            self.history.popleft()
        if len(self.history) >= self.per_minute:
            return None
        delay = min(self.max_s, self.first_s * 2 ** len(self.history))
        self.history.append(now)
        return delay


@dataclass
class Child:
    """One supervised process: what to run, the running process, and its restart bookkeeping."""

    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    restart_at: float | None = None  # monotonic time of a scheduled restart
    given_up: bool = False
    restarts: int = 0

    def start(self) -> None:
        """Start (or restart) the process in its own session, asking for SIGTERM if serve itself dies."""
        self.process = subprocess.Popen(self.argv, env=self.env, start_new_session=True,
                                        preexec_fn=parent_death_signal(os.getpid()))
        log.info("started %s (pid %d)", self.name, self.process.pid)

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process is not None and self.process.poll() is None


def signal_group(child: Child, signum: int) -> None:
    """Signal a child's whole session (it and anything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signum)
