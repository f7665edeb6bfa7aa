"""The worker's registry entry and job leases, kept fresh by a background thread.

Leases are renewed only for jobs this worker still owns (worker.failover.fencing.RENEW_SCRIPT): a worker that wakes
from a stall does not pull back an entry another worker took over, and learns at once that it lost it.

A beat Redis refuses (OOM at maxmemory, READONLY, MISCONF: it answered) still renews the leases and keeps the
registry key alive with EXPIRE (both allowed at maxmemory, which refuses only writes that grow memory): the other
workers see a live worker and take none of its jobs, which it keeps running. While its beats fail, this worker
takes no one else's jobs either (`recovering`): their heartbeats are refused as its own are."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from shared import keys
from shared.redis_commands import describe_refusal, write_refusal
from shared.registry import RegistryEntry
from worker.failover.fencing import Lease, renew_leases
from worker.wire_commands import queue_deregistration, queue_registration

log = logging.getLogger(__name__)
RATE_TIME_CONSTANT_S = 30.0  # the finish rate follows changes over about this long
RETRY_S = 0.1  # the wait before the next beat after a failed (or hung) one


class EwmaRate:
    """The rate of a growing counter while there is work, exponentially smoothed over a time constant (0 until a
    second reading). An idle interval leaves it as it was: the gateways' admission asks how fast a busy worker
    finishes work, and a worker that had none says nothing about that (a rate decayed over a quiet minute refused
    the next burst as if the worker had slowed down)."""

    def __init__(self, time_constant_s: float = RATE_TIME_CONSTANT_S) -> None:
        self.time_constant_s = time_constant_s
        self.rate = 0.0
        self._last: tuple[float, float] | None = None  # (time, counter)

    def update(self, counter: float, now: float, *, idle: bool = False) -> float:
        """Fold in a new reading of the counter (an idle interval: only remembered); returns the smoothed rate per
        second."""
        if self._last is not None and now > self._last[0] and not idle:
            elapsed = now - self._last[0]
            instant = max(0.0, counter - self._last[1]) / elapsed
            weight = 1.0 - math.exp(-elapsed / self.time_constant_s)
            self.rate += weight * (instant - self.rate)
        self._last = (now, counter)
        return self.rate


class EwmaLevel:
    """A gauge's level while there is work, exponentially smoothed over a time constant as EwmaRate smooths a rate
    (the same weights, so the two describe the same intervals; an idle interval leaves it as it was)."""

    def __init__(self, time_constant_s: float = RATE_TIME_CONSTANT_S) -> None:
        self.time_constant_s = time_constant_s
        self.level = 0.0
        self._last: float | None = None  # time of the last reading

    def update(self, value: float, now: float, *, idle: bool = False) -> float:
        """Fold in a reading of the gauge over the interval since the last (an idle interval: only remembered);
        returns the smoothed level (0 until a second reading)."""
        if self._last is not None and now > self._last and not idle:
            weight = 1.0 - math.exp(-(now - self._last) / self.time_constant_s)
            self.level += weight * (value - self.level)
        self._last = now
        return self.level


class Heartbeat:
    """Every interval: refresh the registry hash (model, slots, load, served, state) and renew held jobs' leases."""

    def __init__(self, redis: Redis, *, worker_id: str, model: str, slots: int, interval_s: float, ttl_s: float,
                 gauges: Callable[[], dict[str, int]], held_jobs: Callable[[], list[Lease]],
                 stats: Callable[[], dict[str, float]] | None = None,
                 on_lost: Callable[[list[tuple[str, str]]], None] | None = None,
                 loras: Callable[[], tuple[int, tuple[str, ...]]] | None = None,
                 opens_thinking: bool = False, opens_thinking_disabled: bool = False, harmony: bool = False,
                 facts: Callable[[], str | None] | None = None,
                 drop_tier: Callable[[], None] | None = None, kv_tier: str = "") -> None:
        self.redis = redis
        self.worker_id = worker_id
        self.model = model
        self.slots = slots
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.opens_thinking = opens_thinking  # published so that gateways split a reply that starts in <think>
        self.opens_thinking_disabled = opens_thinking_disabled  # the same with enable_thinking=false
        self.harmony = harmony  # published so that gateways parse replies as harmony channels (gpt-oss)
        self._facts = facts or (lambda: None)  # the model file's JSON facts once read (worker/model_facts.py)
        self.kv_tier = kv_tier  # published: placement prefers workers sharing the tier that holds a prefix
        self._drop_tier = drop_tier  # empties the host's KV tier of the model (None: this worker has no tier)
        self._tier_drops: int | None = None  # the kv-tier-drop counter last read (None: not yet: a baseline)
        self._gauges = gauges  # {"load": sequences in flight, "served": requests ended so far}
        self._held_jobs = held_jobs
        self._on_lost = on_lost or (lambda entries: None)  # told the (stream, entry) another worker owns now
        self._stats = stats or dict  # scheduler statistics for the fleet's /metrics
        self._loras = loras or (lambda: (0, ()))  # (desired-set version, names) of the LoRA adapters loaded
        self._finish_rate = EwmaRate()  # requests ended per second: the gateways' admission estimates the wait
        self._token_rate = EwmaRate()  # tokens generated per second: the same, in tokens (gateway/cluster/admission.py)
        self._finish_load = EwmaLevel()  # sequences in flight while the rates were measured: admission scales them
        self._loaded = False  # whether the last beat saw a job held (the rates skip intervals idle at both ends)
        self.state = "ready"
        self.recovered_at = -math.inf  # monotonic time of the first beat after an outage (failed or hung beats)
        self.failing = False  # the last beat failed (Redis away, or refusing writes)
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def beat(self) -> None:
        """Write the registry entry and renew the lease on every job this worker holds."""
        now = time.time()
        # not a MULTI: the registry hash, the two indexes, the facts hash and the model's tier counter are in different
        # Redis Cluster slots. Nothing needs them together: every beat rewrites them all, and a reader skips an index
        # entry whose hash is missing. A refused write (OOM) is raised by execute() as a MULTI's was.
        pipe = self.redis.pipeline(transaction=False)
        gauges = self._gauges()
        stats = self._stats()
        loaded = gauges.get("load", 0) > 0
        idle, self._loaded = not (loaded or self._loaded), loaded  # no job held at either end of the interval
        stats["finish_rate"] = round(self._finish_rate.update(gauges.get("served", 0), now, idle=idle), 4)
        stats["token_rate"] = round(self._token_rate.update(stats.get("generated_tokens", 0.0), now, idle=idle), 4)
        stats["finish_load"] = round(self._finish_load.update(gauges.get("load", 0), now, idle=idle), 4)
        loras_version, loras = self._loras()
        entry = RegistryEntry(worker_id=self.worker_id, model=self.model, slots=self.slots, heartbeat=now,
                              started=self.started, state=self.state, load=gauges.get("load", 0),
                              served=gauges.get("served", 0), stats=stats, loras=loras,
                              loras_version=loras_version, opens_thinking=self.opens_thinking,
                              opens_thinking_disabled=self.opens_thinking_disabled, harmony=self.harmony,
                              kv_tier=self.kv_tier)
        queue_registration(pipe, entry, ttl_s=self.ttl_s)
        facts = self._facts()
        if facts is not None:  # every beat: a Redis that restarted empty has them again at once
            pipe.hset(keys.MODEL_FACTS, self.model, facts)
        if self._drop_tier is not None:  # last in the pipeline: its reply is the last
            pipe.get(keys.kv_tier_drop(self.model))
        refused: ResponseError | None = None
        try:
            self._check_tier_drop(pipe.execute())
        except ResponseError as exc:
            if write_refusal(exc) is None:
                raise
            refused = exc  # the leases are renewed all the same, then the refusal is raised
            self.redis.expire(keys.worker_key(self.worker_id), max(1, int(self.ttl_s)))
        self._renew()
        if refused is not None:
            raise refused

    def _check_tier_drop(self, replies: list) -> None:
        """Empty the host tier when the drop counter grew since the last beat (absent, after a Redis restart: 0)."""
        if self._drop_tier is None:
            return
        count = int(replies[-1] or 0)
        if self._tier_drops is not None and count != self._tier_drops and count > 0:
            log.info("KV tier of %s dropped by an admin request", self.model)
            self._drop_tier()
        self._tier_drops = count

    def _renew(self) -> None:
        """Renew the lease of every job this worker holds; tell `on_lost` of those another worker owns now."""
        by_stream: dict[str, list[Lease]] = {}
        for lease in self._held_jobs():
            by_stream.setdefault(lease.stream, []).append(lease)
        # XCLAIM by the owner resets the idle time others respect
        lost = [(stream, entry_id) for stream, leases in by_stream.items()
                for entry_id in renew_leases(self.redis, stream, self.worker_id, self.model, leases)]
        if lost:
            self._on_lost(lost)

    def recovering(self) -> bool:
        """True while beats fail and for one TTL after Redis came back from an outage: the other workers'
        registry entries may have expired meanwhile and are being written again, so their jobs are not orphans
        yet."""
        return self.failing or time.monotonic() - self.recovered_at < self.ttl_s

    def deregister(self) -> None:
        """Remove the registry entry (clean shutdown)."""
        pipe = self.redis.pipeline(transaction=False)  # two slots; a leftover index entry is forgotten by its age
        queue_deregistration(pipe, self.worker_id)
        pipe.execute()

    def start(self) -> None:
        """Beat once now, then every interval in the background."""
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 1)

    def _run(self) -> None:
        """Beat every interval; after a failed beat (Redis away) retry every RETRY_S, so the worker is registered
        again the moment Redis answers; after a beat that hung (Redis paused: it wrote a heartbeat time from
        before the pause, already past the TTL for the gateways) beat again at once."""
        wait, failures = self.interval_s, 0
        while not self._stop.wait(wait):
            started = time.monotonic()
            try:
                self.beat()
            except RedisError as exc:
                failures += 1
                self.failing = True
                if failures == 1 and write_refusal(exc) is not None:
                    log.warning("heartbeat refused: %s; this worker keeps its jobs (their leases renewed) and "
                                "retries every %.1fs", describe_refusal(exc), RETRY_S)
                elif failures == 1:
                    log.warning("heartbeat failed: %s; retrying every %.1fs", exc, RETRY_S)
                wait = RETRY_S
                continue
            self.failing = False
            hung = time.monotonic() - started > self.interval_s
            if failures or hung:
                self.recovered_at = time.monotonic()
                log.info("heartbeat: Redis answers again (%d failed beats, %.1fs in the last); registered again",
                         failures, time.monotonic() - started)
            failures = 0
            wait = RETRY_S if hung else self.interval_s
