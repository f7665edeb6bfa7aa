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
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("llmfleet.supervisor")

MAX_RESTARTS_PER_MINUTE = 5
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STDERR_LINES = 20  # a pool worker's last stderr lines kept for its failure reason


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


class PoolChild(Child):
    """A worker process whose stderr is relayed to ours and whose last lines are kept (a load error's cause)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(name, argv, env)
        self.tail: deque[str] = deque(maxlen=STDERR_LINES)

    def start(self) -> None:
        """Start the worker in its own session with SIGTERM on our death, relaying its stderr."""
        self.process = subprocess.Popen(self.argv, env=self.env, start_new_session=True, stderr=subprocess.PIPE,
                                        preexec_fn=parent_death_signal(os.getpid()))
        threading.Thread(target=self._relay, args=(self.process.stderr,), daemon=True).start()
        log.info("started %s (pid %d)", self.name, self.process.pid)

    def _relay(self, pipe: object) -> None:
        for raw in iter(pipe.readline, b""):  # type: ignore[attr-defined]
            sys.stderr.buffer.write(raw)
            sys.stderr.buffer.flush()
            self.tail.append(raw.decode(errors="replace").rstrip())

    def failure_reason(self) -> str:
        """The worker's own error line (`llmfleet: ...`) or its last line, else how it exited."""
        lines = [line for line in self.tail if line.strip()]
        own = [line.removeprefix("llmfleet: ") for line in lines if line.startswith("llmfleet: ")]
        reason = own[-1] if own else (lines[-1] if lines else "")
        code = self.process.returncode if self.process is not None else None
        return (reason or f"the worker exited with code {code}")[:300]
