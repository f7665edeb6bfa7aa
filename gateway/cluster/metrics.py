"""Prometheus metrics of the gateway (`/metrics`), vLLM-style names under `llmfleet_`.

Two sources, one scrape:
- this gateway's requests, observed as they end (counters and latency histograms in a registry of its own,
  so several apps in one process never share numbers);
- the whole fleet, read from Redis at scrape time: every live worker's statistics (published with its
  heartbeat, see shared/registry.py) and every known model's queue depth. So one scrape of any gateway
  sees every worker on every host.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.cluster.registry import Registry
from shared.messages import Timing, Usage
from shared.redis_commands import QueueState
from shared.registry import RegistryEntry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
WORKER_GAUGES = {  # stat name -> (metric name, help)
    "active": ("llmfleet_num_requests_running", "Sequences the worker is running now."),
    "queue_depth": ("llmfleet_worker_requests_waiting", "Requests the worker took but has not started."),
    "kv_tier_bytes_used": ("llmfleet_kv_tier_bytes", "Bytes of valid KV blocks in the host tier file of the worker's "
                           "model (the same file for every worker of the model on its host)."),
}
WORKER_COUNTERS = {
    "prefix_queries": ("llmfleet_prefix_cache_queries", "Prefix-cache lookups."),
    "prefix_hits": ("llmfleet_prefix_cache_hits", "Prefix-cache lookups that reused at least one block."),
    "prefix_tokens_hit": ("llmfleet_prefix_cache_hit_tokens", "Prompt tokens served from cached KV blocks."),
    "preemptions": ("llmfleet_num_preemptions", "Sequences preempted to free KV blocks."),
    "prompt_tokens": ("llmfleet_worker_prompt_tokens", "Prompt tokens the worker prefilled or embedded."),
    "generated_tokens": ("llmfleet_worker_generation_tokens", "Tokens the worker generated."),
    "requests_finished": ("llmfleet_worker_requests_finished", "Requests the worker finished."),
    "steps": ("llmfleet_worker_steps", "Forward steps the worker ran."),
    "interrupted_steps": ("llmfleet_worker_interrupted_steps",
                          "Steps stopped between layers for a request of a higher priority (then redone)."),
    "kv_tier_hits": ("llmfleet_kv_tier_hits", "Admissions that copied at least one KV block from the host tier."),
    "kv_tier_misses": ("llmfleet_kv_tier_misses", "Admissions that asked the host tier and found nothing to copy."),
    "kv_tier_tokens_hit": ("llmfleet_kv_tier_hit_tokens", "Tokens whose KV came from the host tier, not a prefill."),
    "kv_tier_blocks_written": ("llmfleet_kv_tier_blocks_written", "KV blocks the worker wrote to the host tier."),
    "kv_tier_evictions": ("llmfleet_kv_tier_evictions", "Host-tier blocks the worker's writes replaced (LRU)."),
    "kv_tier_skipped": ("llmfleet_kv_tier_skipped_blocks", "Host-tier blocks skipped: torn (checksum), unreadable, "
                        "unwritable, or the writer's queue full."),
}
WORKER_LABELS = ("worker", "model", "host")


@dataclass
class FleetSnapshot:
    """What the fleet looked like at one scrape: live workers, each known model's waiting jobs and all its jobs."""

    workers: list[RegistryEntry] = field(default_factory=list)
    waiting: dict[str, int] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)  # waiting + held by a worker, over every stream of the model


async def fleet_snapshot(registry: Registry, queue_state: Callable[[str], Awaitable[QueueState]]) -> FleetSnapshot:
    """Live workers, and the waiting and all jobs of their models and of the known ones with no live worker
    (scaled to zero: the queued jobs an autoscaler starts one for), for /metrics; `queue_state` is the broker's."""
    workers = await registry.live_workers()
    models = {w.model for w in workers} | set(await registry.known_models())
    states = {model: await queue_state(model) for model in sorted(models)}
    return FleetSnapshot(workers, {model: s.waiting for model, s in states.items()},
                         {model: s.waiting + s.in_flight for model, s in states.items()})


class _FleetCollector(Collector):
    """Metric families of one FleetSnapshot (built per scrape, never registered globally)."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """Worker gauges and counters labelled by worker, model and host; queue depth by model."""
        up = GaugeMetricFamily("llmfleet_worker_up", "Live workers (1 each), by state.", labels=(*WORKER_LABELS, "state"))
        kv = GaugeMetricFamily("llmfleet_kv_cache_usage_ratio", "Fraction of the worker's KV pool in use.",
                               labels=WORKER_LABELS)
        gauges = {stat: GaugeMetricFamily(name, text, labels=WORKER_LABELS) for stat, (name, text) in WORKER_GAUGES.items()}
        counters = {stat: CounterMetricFamily(name, text, labels=WORKER_LABELS)
                    for stat, (name, text) in WORKER_COUNTERS.items()}
        for entry in self.snapshot.workers:
            labels = (entry.worker_id, entry.model, entry.host)
            up.add_metric((*labels, entry.state), 1)
            total = entry.stats.get("kv_blocks_total", 0.0)
            if total:
                kv.add_metric(labels, entry.stats.get("kv_blocks_used", 0.0) / total)
            for stat, family in (*gauges.items(), *counters.items()):
                if stat in entry.stats:
                    family.add_metric(labels, entry.stats[stat])
        waiting = GaugeMetricFamily("llmfleet_num_requests_waiting", "Jobs queued for the model that no worker "
                                    "has taken yet.", labels=("model",))
        for model, depth in sorted(self.snapshot.waiting.items()):
            waiting.add_metric((model,), depth)
        jobs = GaugeMetricFamily("llmfleet_model_jobs", "Jobs of the model waiting or held by a worker, over its "
                                 "shared and per-worker streams (what KEDA scales the workers on).", labels=("model",))
        for model, count in sorted(self.snapshot.jobs.items()):
            jobs.add_metric((model,), count)
        yield from (up, kv, *gauges.values(), *counters.values(), waiting, jobs)


class GatewayMetrics:
    """This gateway's request metrics, plus rendering of the whole exposition with a fleet snapshot."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.success = Counter("llmfleet_request_success", "Choices that ended, by finish reason.",
                               ("model", "finish_reason"), registry=r)
        self.failure = Counter("llmfleet_request_failure", "Requests that failed, by error code.",
                               ("model", "code"), registry=r)
        self.prompt_tokens = Counter("llmfleet_prompt_tokens", "Prompt tokens of finished requests.", ("model",),
                                     registry=r)
        self.generation_tokens = Counter("llmfleet_generation_tokens", "Tokens generated for finished requests.",
                                         ("model",), registry=r)
        self.ttft = Histogram("llmfleet_time_to_first_token_seconds", "Arrival to the first token, as the "
                              "gateway saw it.", ("model",), buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("llmfleet_inter_token_latency_seconds", "Mean time between a request's tokens "
                             "after the first.", ("model",), buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("llmfleet_e2e_request_latency_seconds", "Arrival to the end of the request.",
                             ("model",), buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("llmfleet_request_queue_time_seconds", "Queued until a worker gave the "
                                    "request a batch slot (worker-measured).", ("model",), buckets=LATENCY_BUCKETS,
                                    registry=r)
        self.rate_limited = Counter("llmfleet_api_key_rate_limited", "Requests refused by a key's limit.",
                                    ("key", "limit"), registry=r)
        self.key_tokens = Counter("llmfleet_api_key_tokens", "Tokens (prompt + completion) used per API key.",
                                  ("key",), registry=r)
        self.placements = Counter("llmfleet_placements", "Generation jobs by where prefix-aware placement put "
                                  "them (hit, tier, new, balance: a worker's stream; single, short, full, off: shared).",
                                  ("model", "reason"), registry=r)
        self.in_flight = Gauge("llmfleet_gateway_requests_in_flight", "Requests this gateway is serving now.",
                               registry=r)

    def track(self, model: str) -> RequestTracker:
        """A tracker for one generation request that reports here when it closes."""
        return RequestTracker(self, model)

    def embedding_done(self, model: str, usage: Usage, started: float) -> None:
        """Record a finished embeddings request."""
        self.success.labels(model, "embedding").inc()
        self.prompt_tokens.labels(model).inc(usage.prompt_tokens)
        self.e2e.labels(model).observe(time.monotonic() - started)

    def render(self, snapshot: FleetSnapshot) -> bytes:
        """The text exposition of this gateway's metrics and the fleet's."""
        fleet = CollectorRegistry(auto_describe=False)
        fleet.register(_FleetCollector(snapshot))
        return generate_latest(self.registry) + generate_latest(fleet)


class RequestTracker:
    """Timestamps and outcomes of one request's events; reports to GatewayMetrics once, on close."""

    def __init__(self, metrics: GatewayMetrics, model: str) -> None:
        self._metrics = metrics
        self.model = model
        self.started = time.monotonic()
        self._first: float | None = None
        self._last: float | None = None
        self._tokens = 0
        self._reasons: list[str] = []
        self._queue_s: list[float] = []
        self._error: str | None = None
        self._closed = False
        metrics.in_flight.inc()

    def token(self, count: int = 1) -> None:
        """A token event arrived (count tokens in it)."""
        now = time.monotonic()
        if self._first is None:
            self._first = now
        self._last = now
        self._tokens += count

    def choice_ended(self, reason: str) -> None:
        """One choice finished with an OpenAI finish reason."""
        self._reasons.append(reason)

    def job_done(self, timing: Timing | None) -> None:
        """A job's terminal success (its worker-measured timing, when sent)."""
        if timing is not None:
            self._queue_s.append(timing.queue_s)

    def failed(self, code: str | None) -> None:
        """The request failed with an error of this code."""
        self._error = code or "error"

    def close(self, usage: Usage, *, complete: bool) -> None:
        """Report once: `complete` False means the request stopped before every job ended (client gone)."""
        if self._closed:
            return
        self._closed = True
        m, model = self._metrics, self.model
        m.in_flight.dec()
        if self._error is not None:
            m.failure.labels(model, self._error).inc()
        elif not complete:
            m.failure.labels(model, "cancelled").inc()
        for reason in self._reasons:
            m.success.labels(model, reason).inc()
        m.prompt_tokens.labels(model).inc(usage.prompt_tokens)
        m.generation_tokens.labels(model).inc(usage.completion_tokens)
        end = time.monotonic()
        m.e2e.labels(model).observe(end - self.started)
        if self._first is not None:
            m.ttft.labels(model).observe(self._first - self.started)
        if self._last is not None and self._first is not None and self._tokens > 1:
            m.itl.labels(model).observe((self._last - self._first) / (self._tokens - 1))
        for queue_s in self._queue_s:
            m.queue_time.labels(model).observe(queue_s)


def models_of(workers: Iterable[RegistryEntry]) -> set[str]:
    """The models the given workers serve."""
    return {w.model for w in workers}
