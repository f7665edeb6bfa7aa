"""The node agent: a pool of model-pinned worker processes on one host, loaded on demand and evicted LRU.

Every tick (half a second) the node reads the fleet from Redis (live workers, its models' queue depths, the
admin commands, the gateways' last-use and keep-alive marks) and then:
- supervises its workers: one that registers is ready (its load claim is released); one that exits before
  that failed to load (the failure is remembered and every waiting request of the model gets the error);
  one that dies after it was ready is restarted with backoff, as `serve` restarts its children;
- unloads idle workers whose keep-alive ran out (pinned ones never: `serve`'s eager models);
- fails a load not ready within LLMFLEET_POOL_LOAD_TIMEOUT_S (a pinned one waits: it has no deadline);
- places demand: a catalogued model with queued requests (jobs held by a worker with no registry entry count:
  one that stopped or died as it read them) or an admin load, and no live worker, is loaded
  here if this node wins its claim (SET NX) and has room, evicting least-recently-used idle workers
  (never one with queued or in-flight work); a model whose queue stays deep gets a second replica.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from redis import Redis
from redis.exceptions import RedisError

from llmfleet import warm_pool_redis
from llmfleet.catalogue import estimate_bytes, local_file
from llmfleet.child import Child, PoolChild, describe_exit
from llmfleet.warm_pool_redis import QueueDepth
from shared import keys
from shared.registry import READY as WORKER_READY
from shared.registry import RegistryEntry
from shared.settings import Settings
from shared.warm_pool import LOADING, READY, STOPPING, ModelSlot, NodeState

log = logging.getLogger("llmfleet.node")

TICK_S = 0.5
REPLICA_QUEUE_DEPTH = 4  # waiting jobs per ready replica that ask for one more replica
SETTLE_S = 5.0  # a finished load keeps its claim this long, so no node loads the model again on a stale view
CLAIM_TTL_S = 10.0  # a load claim lapses this long after its node stopped renewing it (each tick): a dead node's too
EVICT_WAIT_S = 15.0


@dataclass
class PoolWorker:
    """One worker of the pool: its model, process, registry id and bookkeeping."""

    model: str
    child: PoolChild
    memory: int
    pinned: bool
    state: str = LOADING
    worker_id: str = ""
    load_deadline: float = 0.0  # monotonic
    ready_once: bool = False
    stop_sent: float | None = None


@dataclass
class FleetView:
    """What one tick knows about the fleet."""

    workers: list[RegistryEntry]
    depth: dict[str, QueueDepth]
    used: dict[str, float]
    keep_alive: dict[str, float]
    ready_ids: set[str] = field(default_factory=set)

    def ready_replicas(self, model: str) -> int:
        """Live, ready workers of `model` anywhere in the fleet."""
        return sum(1 for w in self.workers if w.model == model and w.state == WORKER_READY)

    def in_flight(self, model: str) -> int:
        """Sequences of `model` its workers report running."""
        return sum(w.load for w in self.workers if w.model == model)


class Node:
    """A node agent's pool: call tick() periodically; stop() drains every worker."""

    def __init__(self, redis: Redis, settings: Settings, catalogue: dict[str, str], *, env: dict[str, str],
                 max_loaded: int, memory_budget: int, pinned: dict[str, int] | None = None,
                 node_id: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.settings = settings
        self.catalogue = catalogue
        self.env = env
        self.max_loaded = max_loaded
        self.memory_budget = memory_budget
        self.pinned = dict(pinned or {})  # model -> replicas loaded eagerly and never unloaded for idleness
        self.node_id = node_id or f"node-{uuid.uuid4().hex[:8]}"
        self.clock = clock
        self.workers: list[PoolWorker] = []
        self.given_up: list[PoolWorker] = []
        self.wanted: dict[str, float] = {}  # model -> unix s until which an admin load asks for it
        self.last_busy: dict[str, float] = {}
        self._estimates: dict[str, int] = {}
        for model in catalogue:  # now, not on a request's cold start
            self._estimate(model)
        threading.Thread(target=self._publish_facts, name="model-facts", daemon=True).start()
        self._commands_after = warm_pool_redis.last_command_id(redis)
        self._serial = 0

    # ---- the tick -----------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Read the fleet, supervise, unload idle workers, place demand, publish the node's state."""
        now, mono = self.clock(), time.monotonic()
        view = self._view(now)
        self._commands(view, now)
        self._supervise(view, now, mono)
        self._unload_idle(view, now)
        self._place(view, now)
        warm_pool_redis.publish_state(self.redis, self.state(now))

    def _view(self, now: float) -> FleetView:
        workers = warm_pool_redis.live_workers(self.redis, self.settings.heartbeat_ttl_s, now)
        depth = warm_pool_redis.queue_depths(self.redis, sorted(self.catalogue))
        used, keep_alive = warm_pool_redis.usage(self.redis)
        view = FleetView(workers, depth, used, keep_alive, {w.worker_id for w in workers if w.state == WORKER_READY})
        for model in self.catalogue:
            if depth.get(model, QueueDepth()).busy or view.in_flight(model):
                self.last_busy[model] = now
        return view

    def _commands(self, view: FleetView, now: float) -> None:
        commands, self._commands_after = warm_pool_redis.read_commands(self.redis, self._commands_after)
        for command in commands:
            model, op = command.get("model", ""), command.get("op")
            if model not in self.catalogue:
                continue
            if op == "load":
                self.wanted[model] = now + self.settings.pool_load_timeout_s
            elif op == "unload":
                self.wanted.pop(model, None)
                self.pinned.pop(model, None)
                force = command.get("force") == "1"
                for worker in self._of(model):
                    if force or not self._busy(view, model):
                        self._stop(worker, "unloaded by an admin request")

    def _supervise(self, view: FleetView, now: float, mono: float) -> None:
        for worker in list(self.workers):
            child = worker.child
            if worker.state == STOPPING:
                if not child.running:
                    self.workers.remove(worker)
                elif worker.stop_sent is not None and mono - worker.stop_sent > self.settings.drain_timeout_s + 5:
                    self._signal(worker, signal.SIGKILL)
                continue
            if child.restart_at is not None:
                if mono >= child.restart_at:
                    child.restart_at = None
                    child.restarts += 1
                    self._start(worker)
                continue
            # registered first, then exited: it was ready (it may have served requests), so a crash, not a load
            # failure, even when it died before this loop saw it registered
            if worker.state == LOADING and worker.worker_id in view.ready_ids:
                worker.state, worker.ready_once = READY, True
                log.info("%s is ready (%s)", worker.child.name, worker.model)
                self.wanted.pop(worker.model, None)
                warm_pool_redis.release_load(self.redis, worker.model, self.node_id, keep_s=SETTLE_S)
            if not child.running:
                self._exited(worker, mono)
                continue
            if worker.state == LOADING and mono > worker.load_deadline:
                self._signal(worker, signal.SIGKILL)
                child.process.wait()
                self._failed(worker, f"not ready within {self.settings.pool_load_timeout_s:.0f}s")
            elif worker.state == LOADING and not worker.pinned:
                warm_pool_redis.release_load(self.redis, worker.model, self.node_id, keep_s=CLAIM_TTL_S)  # renew

    def _exited(self, worker: PoolWorker, mono: float) -> None:
        """A worker process ended on its own: a failed load, or a crash to restart with backoff."""
        child = worker.child
        if not worker.ready_once:
            self._failed(worker, child.failure_reason())
            return
        delay = child.policy.next_delay(mono)
        if delay is None:
            log.error("%s exited unexpectedly %d times within a minute; not restarting it (%s)", child.name,
                      child.policy.per_minute, worker.model)
            self.workers.remove(worker)
            self.given_up.append(worker)
            return
        log.error("%s exited unexpectedly (%s); restarting it in %.1fs (%s)", child.name,
                  describe_exit(child.process.returncode), delay, worker.model)
        child.restart_at = mono + delay
        worker.state = LOADING

    def _failed(self, worker: PoolWorker, reason: str) -> None:
        """A load failed: remember it, end the model's waiting requests with the error, drop the worker."""
        message = f"model '{worker.model}' could not be loaded: {reason}"
        log.error("%s", message)
        self.workers.remove(worker)
        self.wanted.pop(worker.model, None)
        ttl = self.settings.pool_failure_ttl_s
        warm_pool_redis.record_failure(self.redis, worker.model, message, ttl)
        warm_pool_redis.release_load(self.redis, worker.model, self.node_id)
        warm_pool_redis.fail_waiting(self.redis, worker.model, self.node_id, message, retry_after=ttl,
                                journal_ttl_s=int(self.settings.request_timeout_s + 60))

    def _unload_idle(self, view: FleetView, now: float) -> None:
        for worker in self._of(None):
            if worker.state != READY or worker.pinned or self._busy(view, worker.model):
                continue
            keep = view.keep_alive.get(worker.model, self.settings.pool_keep_alive_s)
            if keep >= 0 and now - self._last_used(view, worker.model) >= keep:
                self._stop(worker, f"idle for {keep:.0f}s (keep-alive)")

    def _place(self, view: FleetView, now: float) -> None:
        for model, replicas in self.pinned.items():  # serve's eager models: loaded whatever the budget says
            if warm_pool_redis.remembered_failure(self.redis, model) is not None:
                continue
            while len(self._of(model)) < replicas:
                self._launch(model, pinned=True, evict=[])
        registered = {w.worker_id for w in view.workers}
        for model in sorted(self.catalogue, key=lambda m: -view.depth.get(m, QueueDepth()).waiting):
            depth = view.depth.get(model, QueueDepth())
            # a job a worker read as it stopped (keep_alive 0, an eviction) or died holding waits for a takeover
            # by another worker of its model: with none left, it is demand like a waiting one
            waiting = depth.waiting + depth.orphaned(registered)
            wanted = waiting > 0 or self.wanted.get(model, 0.0) > now
            ready = view.ready_replicas(model)
            if not wanted or self._of(model) and ready == 0:
                continue  # no demand, or ours is loading (or restarting) already
            if ready and (self._of(model) or waiting < REPLICA_QUEUE_DEPTH * ready):
                continue  # served; a second replica only when its queue is deep, and not two here
            evict = self._room(view, model, evict=True)
            if evict is None or warm_pool_redis.remembered_failure(self.redis, model) is not None:
                continue
            if not warm_pool_redis.claim_load(self.redis, model, self.node_id, CLAIM_TTL_S):
                continue  # another node loads it
            fresh = warm_pool_redis.live_workers(self.redis, self.settings.heartbeat_ttl_s, self.clock())
            if sum(1 for w in fresh if w.model == model and w.state == WORKER_READY) > ready:
                warm_pool_redis.release_load(self.redis, model, self.node_id)
                continue  # a load elsewhere finished meanwhile
            self._launch(model, pinned=False, evict=evict)

    # ---- placement ------------------------------------------------------------------------------------------

    def _room(self, view: FleetView, model: str, *, evict: bool) -> list[PoolWorker] | None:
        """The idle workers to evict (LRU first) so one more worker of `model` fits, or None if it cannot."""
        need = self._estimate(model)
        count, used = len(self.workers), sum(w.memory for w in self.workers)
        candidates = sorted((w for w in self.workers if w.state == READY and not w.pinned
                             and not self._busy(view, w.model)), key=lambda w: self._last_used(view, w.model))
        chosen: list[PoolWorker] = []
        while (self.max_loaded and count + 1 > self.max_loaded) or used + need > self.memory_budget:
            if not evict or not candidates:
                return None
            victim = candidates.pop(0)
            chosen.append(victim)
            count, used = count - 1, used - victim.memory
        return chosen

    def _launch(self, model: str, *, pinned: bool, evict: list[PoolWorker]) -> None:
        """Evict (drain and wait for) the chosen idle workers, then start a worker for `model`."""
        for victim in evict:
            self._stop(victim, f"evicted (least recently used) to load {model}")
        deadline = time.monotonic() + EVICT_WAIT_S
        for victim in evict:
            try:
                victim.child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(victim, signal.SIGKILL)
                victim.child.process.wait()
            if victim in self.workers:
                self.workers.remove(victim)
        if evict and not pinned:  # the wait may have been long: hold the claim from now
            warm_pool_redis.release_load(self.redis, model, self.node_id, keep_s=CLAIM_TTL_S)
        self._serial += 1
        name = f"worker-{self._serial}" if len(self.catalogue) == 1 else f"worker-{model}-{self._serial}"
        worker = PoolWorker(model, PoolChild(name, [], self.env), self._estimate(model), pinned)
        self.workers.append(worker)
        self._start(worker)

    def _start(self, worker: PoolWorker) -> None:
        """(Re)start a worker process under a fresh registry id."""
        worker.worker_id = f"{worker.model}-{self.node_id}-{uuid.uuid4().hex[:6]}"
        worker.child.argv = [sys.executable, "-m", "llmfleet.cli", "worker", "--model",
                             self.catalogue.get(worker.model, worker.model), "--served-as", worker.model,
                             "--worker-id", worker.worker_id]
        # serve's eager models wait for their load however long it takes (a first repack of an 8B file takes
        # minutes on 2 cores; killing it would only start it over); an on-demand load has waiting requests
        worker.state, worker.load_deadline = LOADING, (
            math.inf if worker.pinned else time.monotonic() + self.settings.pool_load_timeout_s)
        worker.child.start()

    def _stop(self, worker: PoolWorker, why: str) -> None:
        if worker.state == STOPPING:
            return
        log.info("stopping %s (%s): %s", worker.child.name, worker.model, why)
        worker.state, worker.stop_sent = STOPPING, time.monotonic()
        if worker.child.restart_at is not None or not worker.child.running:
            worker.child.restart_at = None
            return
        self._signal(worker, signal.SIGTERM)

    @staticmethod
    def _signal(worker: PoolWorker, signum: int) -> None:
        if worker.child.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.child.process.pid, signum)

    def _busy(self, view: FleetView, model: str) -> bool:
        return view.depth.get(model, QueueDepth()).busy or view.in_flight(model) > 0

    def _last_used(self, view: FleetView, model: str) -> float:
        return max(view.used.get(model, 0.0), self.last_busy.get(model, 0.0))

    def _of(self, model: str | None) -> list[PoolWorker]:
        """Our workers (of one model), stopping ones left out."""
        return [w for w in self.workers if w.state != STOPPING and (model is None or w.model == model)]

    def _publish_facts(self) -> None:
        """Publish the facts (size, digest, details) of every catalogued file here, for Ollama's /api/tags before
        a worker of the model ever ran; a worker of the model rewrites them every heartbeat."""
        from worker.model_facts import facts_json

        for model, source in self.catalogue.items():
            path = local_file(source)
            facts = facts_json(path) if path is not None else None
            if facts is not None:
                try:
                    self.redis.hsetnx(keys.MODEL_FACTS, model, facts)
                except RedisError as exc:
                    log.info("cannot publish %s's facts: %s", model, type(exc).__name__)

    def _estimate(self, model: str) -> int:
        if model not in self._estimates:
            self._estimates[model] = estimate_bytes(self.catalogue[model], self.settings.kv_budget_mib)
        return self._estimates[model]

    # ---- state and shutdown ---------------------------------------------------------------------------------

    def state(self, now: float) -> NodeState:
        """The node's state hash: its catalogue and what it runs or loads."""
        models: dict[str, ModelSlot] = {}
        for worker in self.workers:
            slot = models.get(worker.model)
            state = READY if worker.state == READY or (slot and slot.state == READY) else worker.state
            models[worker.model] = ModelSlot(state=state, replicas=(slot.replicas if slot else 0) + (worker.state == READY),
                                             memory=(slot.memory if slot else 0) + worker.memory,
                                             last_used=self.last_busy.get(worker.model, 0.0), pinned=worker.pinned)
        return NodeState(node_id=self.node_id, heartbeat=now, max_loaded=self.max_loaded,
                         memory_budget=self.memory_budget, catalogue=self.catalogue, models=models,
                         pinned=tuple(self.pinned))

    @property
    def children(self) -> list[Child]:
        """Every worker process this node started (for the supervisor's status and kill_all)."""
        return [w.child for w in self.workers]

    def expected(self) -> int:
        """Workers this node means to run (ready, loading or restarting) plus the ones it gave up on."""
        return len(self._of(None)) + len(self.given_up)

    def stop(self, grace_s: float) -> None:
        """Drain every worker (SIGTERM), SIGKILL those still there after grace_s, then remove the node's state."""
        for worker in self.workers:
            self._stop(worker, "the node is stopping")
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            if worker.child.process is None:
                continue
            try:
                worker.child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(worker, signal.SIGKILL)
                worker.child.process.wait()
        try:
            for model in self.catalogue:
                warm_pool_redis.release_load(self.redis, model, self.node_id)
            warm_pool_redis.remove_state(self.redis, self.node_id)
        except RedisError as exc:
            log.warning("could not remove the node's state: %s", type(exc).__name__)
