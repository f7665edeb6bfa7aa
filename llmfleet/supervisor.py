"""`llmfleet serve` as a supervisor: restart what dies, stop everything in order, leave nothing behind.

Children run in their own sessions, so a terminal's Ctrl-C reaches only `serve`, which then stops them in
order: the gateway first (it stops taking requests and finishes open streams, up to the drain timeout)
together with the batch runner (it puts the batch it runs back in the queue), then the workers (they finish what they hold), then the bundled Redis. A worker or gateway that exits on
its own is logged with its exit code or signal and restarted with exponential backoff; past
MAX_RESTARTS_PER_MINUTE it is left down, and `serve` keeps running with the rest and says so in the logs
and in /ready. The bundled Redis dying is fatal: a new empty Redis would silently drop every queued job
and journal, so `serve` shuts everything down with a clear message instead.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from llmfleet.child import Child, describe_exit, signal_group

if TYPE_CHECKING:
    from llmfleet.node import Node

log = logging.getLogger("llmfleet.supervisor")

STATUS_TTL_S = 10


class Supervisor:
    """Runs the gateway and workers of `serve`, restarting them; stop() ends them in order."""

    def __init__(self, gateway: Child, workers: list[Child], *, drain_timeout_s: float,
                 redis_alive: object = None, status: object = None, batch_runner: Child | None = None,
                 node: Node | None = None) -> None:
        self.gateway = gateway
        self.node = node  # a node agent's pool of workers (serve's models), ticked every poll
        self.workers = workers
        self.batch_runner = batch_runner  # `llmfleet batch-runner`: executes /v1/batches
        self.drain_timeout_s = drain_timeout_s
        self._redis_alive = redis_alive  # callable -> bool, or None when Redis is not ours
        self._status = status  # callable(dict) publishing the supervisor's state, or None
        self.stopping = False
        self.signals = 0

    @property
    def children(self) -> list[Child]:
        """The gateway, the batch runner (if any), then the workers (the node's too)."""
        return [self.gateway, *self._front, *self.workers, *(self.node.children if self.node else [])]

    @property
    def _fixed(self) -> list[Child]:
        """The children this supervisor restarts itself (the node supervises its own workers)."""
        return [self.gateway, *self._front, *self.workers]

    @property
    def _front(self) -> list[Child]:
        return [self.batch_runner] if self.batch_runner is not None else []

    def start(self) -> None:
        """Start every child."""
        for child in self.children:
            child.start()

    def on_signal(self, signum: int, _frame: object) -> None:
        """First SIGINT/SIGTERM: drain and stop; a second one: stop at once."""
        self.signals += 1
        if self.signals == 1:
            log.info("%s: draining (up to %.0fs), then stopping; send it again to stop at once",
                     signal.Signals(signum).name, self.drain_timeout_s)
            self.stopping = True
        else:
            log.warning("%s again: stopping now", signal.Signals(signum).name)
            raise KeyboardInterrupt

    def run(self, poll_s: float = 0.5, *, ready: object = None, on_ready: object = None) -> int:
        """Supervise until a stop signal (0) or the death of the bundled Redis (1).

        `ready` (a callable -> bool) is polled until it first holds, then `on_ready()` is called once;
        children are supervised from the start, also while the service is coming up.
        """
        announced = ready is None
        while not self.stopping:
            if not announced and ready():
                announced = True
                on_ready()
            if self._redis_alive is not None and not self._redis_alive():
                log.error("the bundled redis-server died; every queued job and stream is gone with it: shutting down")
                return 1
            now = time.monotonic()
            for child in self._fixed:
                self._check(child, now)
            self._tick_node()
            self._publish_status()
            time.sleep(poll_s)
        return 0

    def _check(self, child: Child, now: float) -> None:
        """Notice an unexpected exit, schedule its restart with backoff, or restart it when due."""
        if child.given_up:
            return
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restart_at = None
                child.restarts += 1
                child.start()
            return
        if child.process is None or child.running:
            return
        how = describe_exit(child.process.returncode)
        delay = child.policy.next_delay(now)
        if delay is None:
            child.given_up = True
            log.error("%s exited unexpectedly (%s) %d times within a minute; not restarting it: serve goes on "
                      "with the rest", child.name, how, child.policy.per_minute)
            return
        log.error("%s exited unexpectedly (%s); restarting it in %.1fs", child.name, how, delay)
        child.restart_at = now + delay

    def _tick_node(self) -> None:
        """One turn of the node agent's pool (Redis may be briefly away: the next turn tries again)."""
        if self.node is None:
            return
        try:
            self.node.tick()
        except (RedisError, OSError) as exc:
            log.warning("the node's pool turn failed: %s", type(exc).__name__)

    def _publish_status(self) -> None:
        """Tell the gateway's /ready how many workers serve runs and which ones it gave up on."""
        if self._status is None:
            return
        pool = self.node.children if self.node else []
        given_up = [w.name for w in self.workers if w.given_up] + \
            [w.child.name for w in (self.node.given_up if self.node else [])]
        try:
            self._status({
                "workers_expected": len(self.workers) + (self.node.expected() if self.node else 0),
                "workers_running": sum(1 for w in [*self.workers, *pool] if w.running),
                "workers_given_up": ",".join(given_up),
                "restarts": sum(c.restarts for c in self.children),
            })
        except Exception as exc:  # Redis may be briefly away; /ready says so on its own
            log.debug("could not publish the supervisor status: %s", exc)

    def stop(self) -> None:
        """The gateway first (finishes open streams) with the batch runner (puts its batch back in the queue),
        then the workers (finish what they hold)."""
        self.stopping = True
        self._stop_group([self.gateway, *self._front], self.drain_timeout_s + 5)
        self._stop_group(self.workers, self.drain_timeout_s + 5)
        if self.node is not None:
            self.node.stop(self.drain_timeout_s + 5)

    def kill_all(self) -> None:
        """SIGKILL every child still running (after a second signal)."""
        for child in self.children:
            if child.running:
                signal_group(child, signal.SIGKILL)
                child.process.wait()

    @staticmethod
    def _stop_group(children: list[Child], grace_s: float) -> None:
        """SIGTERM the children, wait up to grace_s, then SIGKILL stragglers."""
        for child in children:
            if child.running:
                signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", child.name, grace_s)
                signal_group(child, signal.SIGKILL)
                child.process.wait()
