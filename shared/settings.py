"""Frozen settings read once from the environment; bad values fail fast with the variable's name."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.redis_target import RedisTarget, parse_sentinels

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
KV_DTYPES = ("float16", "float32")  # what a KV pool can hold: the engine's own list (worker/engine/kv/pool.py, which
# imports nothing of shared/) is checked equal by tests/worker/engine/kv/test_pool.py
REASONING_FORMATS = ("deepseek", "none")  # as llama-server's --reasoning-format
REASONING_FIELDS = ("both", "reasoning", "reasoning_content")  # chat's reasoning output: vLLM's name, DeepSeek's, both
_POSITIVE_INTS = (
    "max_body_bytes", "max_prompt_chars", "max_tokens_limit", "max_n", "max_embed_inputs", "queue_limit",
    "stream_maxlen", "max_deliveries", "redis_max_connections", "max_batch_tokens", "max_prefill_tokens",
    "max_file_bytes", "max_batch_lines", "batch_concurrency", "max_loras",
)
_POSITIVE_FLOATS = (
    "request_timeout_s", "retry_after_s", "heartbeat_interval_s", "heartbeat_ttl_s", "lease_s",
    "model_memory_s", "kv_budget_mib", "drain_timeout_s", "sse_queued_after_s", "sse_keepalive_s",
    "batch_lease_s", "lora_memory_mib", "prefix_ttl_s", "steal_after_s", "pool_load_timeout_s",
    "pool_failure_ttl_s", "responses_ttl_s",
)
_NON_NEGATIVE = (
    "deadline_grace_s", "registry_cache_s", "prefix_cache", "slots", "threads", "default_max_tokens",
    "public_metrics", "any_model_name", "worker_wait_s", "prefix_placement", "placement_balance_abs",
    "pool_max_loaded", "pool_memory_mib", "pool_keep_alive_s", "allow_open", "causal_embeddings",
    "stream_retention_s", "orphan_grace_s", "kv_tier_mib", "kv_commit_ahead_mib", "warm_up", "fair_shares",
    "redis_cluster",
)
_CHOICES = {"log_level": _LOG_LEVELS, "reasoning_format": REASONING_FORMATS, "reasoning_fields": REASONING_FIELDS,
            "kv_dtype": KV_DTYPES}
_LONGER_THAN_HEARTBEAT = ("heartbeat_ttl_s", "lease_s")


def _setting(default: Any, doc: str, *, secret: bool = False) -> Any:
    """A Settings field with its meaning, which the configuration reference and the CLI's --help print."""
    return field(default=default, repr=not secret, metadata={"doc": doc})


class SettingsError(ValueError):
    """A setting has a value llmfleet cannot use; the message names the environment variable."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """All knobs of gateway and workers; see ENV for the environment variable of each field."""

    redis_url: str = _setting("redis://localhost:6379/0", "The Redis every part shares. Unset under `llmfleet serve`: "
                              "it starts a bundled redis-server on a free local port.", secret=True)  # may hold a password
    redis_sentinels: str = _setting("", "Redis high availability: comma-separated `host:port` of Redis Sentinels "
                                    "(e.g. 3); every process then asks them for the primary of "
                                    "REDIS_SENTINEL_MASTER and follows a failover to the promoted replica. "
                                    "REDIS_URL then gives only password, database and TLS. Empty: REDIS_URL "
                                    "alone (docs/operations/redis-ha.md).")
    redis_sentinel_master: str = _setting("mymaster", "The Sentinel group name of the primary (sentinel.conf's "
                                          "`sentinel monitor NAME ...`); read only with REDIS_SENTINELS.")
    redis_cluster: int = _setting(0, "1: the Redis is a Redis Cluster (7.0 or later: events use sharded pub/sub); "
                                  "REDIS_URL names any one node of it, a seed, and gives password and TLS. Not with "
                                  "REDIS_SENTINELS or a unix: URL; the Batches API and batch runner refuse it (rq "
                                  "cannot run on a cluster). 0: one Redis (docs/operations/capacity.md).")
    redis_max_connections: int = _setting(64, "The gateway's Redis connection pool; requests wait for a free connection.")
    host: str = _setting("127.0.0.1", "The gateway's listen address.")
    port: int = _setting(8000, "The gateway's listen port.")
    api_key: str | None = _setting(None, "One shared API key (named `default` in logs and metrics): every route but "
                                   "the public ones needs it. See also LLMFLEET_KEYS_FILE.", secret=True)
    allow_open: int = _setting(0, "1: a gateway other hosts can reach may run with no API key (it warns); 0: it "
                               "refuses to start, saying why (gateway/http/exposure.py).")
    published_host: str | None = _setting(None, "Where a container runtime publishes the gateway (compose sets it "
                                           "from LLMFLEET_PUBLISH); the open-endpoint check reads it instead of "
                                           "LLMFLEET_HOST.")
    max_body_bytes: int = _setting(1024 * 1024, "The largest request body (1 MiB); past it a 413.")
    max_prompt_chars: int = _setting(400_000, "The largest prompt, over all messages or prompts of one request; "
                                     "past it a 400 naming the field.")
    max_tokens_limit: int = _setting(4096, "The largest max_tokens a request may ask for; past it a 400.")
    public_metrics: int = _setting(1, "1: /metrics is public like /health; 0: it needs a key like the API (when "
                                   "keys are configured).")
    default_max_tokens: int = _setting(1024, "The max_tokens of a chat request that sets none, applied by the worker "
                                       "and cut to what the context has left; 0 = up to the context.")
    max_n: int = _setting(16, "The most choices per request (n times the number of prompts).")
    max_embed_inputs: int = _setting(2048, "The most inputs of one embeddings request.")
    queue_limit: int = _setting(256, "Waiting (not yet taken) jobs per model before a 429 with Retry-After.")
    stream_maxlen: int = _setting(10_000, "The approximate cap of each Redis job stream (a safety net).")
    request_timeout_s: float = _setting(600.0, "The deadline of every request (created + this); both sides enforce "
                                        "it (504).")
    deadline_grace_s: float = _setting(1.0, "How long the gateway waits past a deadline for the worker's error.")
    retry_after_s: float = _setting(2.0, "The Retry-After of a 429 or 503.")
    sse_queued_after_s: float = _setting(0.25, "A stream whose work has not started by then opens with `: queued`.")
    sse_keepalive_s: float = _setting(1.0, "The longest a stream goes without a byte: an SSE comment is sent after "
                                      "this long without an event (queued, failover, Redis pause).")
    heartbeat_interval_s: float = _setting(0.5, "How often workers refresh their registry entry and leases.")
    heartbeat_ttl_s: float = _setting(2.5, "A worker without a heartbeat this long is dead: its jobs fail over within "
                                      "this + 0.5 s (worker/serve/job_feeder.py RECLAIM_EVERY_S); a worker stalled "
                                      "this long loses its jobs (fenced, resumed, the work redone).")
    lease_s: float = _setting(30.0, "A job idle this long in a pending list may be reclaimed (XAUTOCLAIM): a silent "
                              "worker's jobs are resumed after it.")
    max_deliveries: int = _setting(3, "A job started this many times without finishing (each holder died or "
                                   "stalled) is dead-lettered on its next takeover; a batch whose runners died "
                                   "this often fails.")
    slots: int = _setting(0, "Sequences one worker runs at once; 0 or `auto` = derived from the KV pool (up to 64; "
                             "a hybrid model's recurrent states take at most half the KV budget).")
    threads: int = _setting(0, "BLAS and compiled-kernel threads of one worker; 0 = every core (`serve --workers N` "
                            "gives each worker cores / N).")
    kv_budget_mib: float = _setting(1024.0, "The worker's KV pool, allocated once in blocks; its pages are committed "
                                    "as blocks are first written, so a worker's resident memory grows to it with "
                                    "use. When it is full the scheduler preempts.")
    kv_dtype: str = _setting("float16", "The KV pool's keys and values: float16 (llama.cpp's default: half the "
                             "memory and half the bytes decode attention reads) or float32 (twice the memory). "
                             "Numerics are batch-invariant with either, so a failed-over stream repeats the "
                             "undisturbed text.")
    prefix_cache: int = _setting(1, "1: full prompt blocks stay cached in the KV pool's free space and are shared; "
                                 "0: off.")
    kv_tier_mib: float = _setting(1024.0, "The host tier: full KV blocks of cached prefixes every worker of a model on "
                                  "this host shares, in one file per model of at most this size (LRU); it survives "
                                  "worker restarts and serves failovers. Its pages are taken as blocks are written. "
                                  "0: off.")
    kv_commit_ahead_mib: float = _setting(0.0, "KV pool memory committed past the highest block used, by a thread: "
                                          "host-tier fills (failovers) skip zeroing pages. 0: as blocks are written.")
    kv_tier_dir: str = _setting("", "Where the host tier's files live; empty: /dev/shm/llmfleet-kv (shared memory). A "
                                "directory that cannot be written turns the tier off with one log line.")
    max_batch_tokens: int = _setting(2048, "Tokens (decodes + prefill chunks) in one forward step.")
    max_prefill_tokens: int = _setting(512, "The largest prefill chunk of one sequence in one step.")
    model_memory_s: float = _setting(86_400.0, "A model stays known (503, not 404) this long after its last worker.")
    worker_wait_s: float = _setting(120.0, "A request for a known model with no live worker (scaled to zero, all "
                                    "its workers restarting) is queued and waits this long for one to register "
                                    "(streams get `: queued` and keep-alives; the queued job is what an "
                                    "autoscaler such as KEDA starts a worker for), then ends with a 503 "
                                    "no_worker_available; 0 = that 503 at once.")
    registry_cache_s: float = _setting(1.0, "How long the gateway reuses a worker-registry read (0.1 s for /ready "
                                       "and a model it lacks).")
    drain_timeout_s: float = _setting(60.0, "On SIGTERM/SIGINT, how long the gateway lets open streams finish and a "
                                      "worker finishes its jobs (the rest resume on other workers).")
    supervisor_key: str | None = _setting(None, "Set by `serve`: the Redis hash /ready reads the supervisor's state "
                                          "from.")
    chat_template: str | None = _setting(None, "A jinja2 chat template file workers use instead of the model's own "
                                         "(base models need one for chat).")
    keys_file: str | None = _setting(None, "Named API keys with per-key limits, managed by `llmfleet keys`; the "
                                     "gateways see changes within 1 s.")
    cors_origins: str = _setting("", "Comma-separated origins browsers may call the API from (`*` = any; empty = no "
                                 "CORS); preflights need no key.")
    any_model_name: int = _setting(0, "1: with exactly one model served, any `model` name is served by it (as "
                                   "llama-server).")
    max_file_bytes: int = _setting(50 * 1024 * 1024, "The largest uploaded file on /v1/files (50 MiB); past it a 413.")
    max_batch_lines: int = _setting(50_000, "Requests in one batch input file (OpenAI's limit); past it a 400.")
    batch_concurrency: int = _setting(8, "Requests of one batch a batch runner has in flight at once (priority low).")
    batch_lease_s: float = _setting(10.0, "A batch whose runner stopped renewing its lease this long is resumed by "
                                    "another runner.")
    max_loras: int = _setting(8, "LoRA adapters loaded per model; POST /admin/loras past it is a 409.")
    lora_memory_mib: float = _setting(512.0, "LoRA weights per worker, all together; a load past it fails, naming it.")
    prefix_placement: int = _setting(1, "1: the gateway places a request on the worker that has its prompt prefix "
                                     "cached (when it has room); 0: every job on the shared stream.")
    prefix_ttl_s: float = _setting(300.0, "How long the gateway remembers which worker got a prompt prefix.")
    steal_after_s: float = _setting(1.0, "A job waiting this long on a busy worker's stream may be taken by an idle one.")
    placement_balance_abs: int = _setting(8, "Loads (running + placed) differing by more than this and 1.5x: the "
                                          "least busy worker wins whatever the cache.")
    pool_max_loaded: int = _setting(0, "A node agent's loaded workers at most (0 = as many as the memory budget "
                                    "allows).")
    pool_memory_mib: float = _setting(0.0, "A node agent's memory budget for its workers, weights + KV pool each "
                                      "(0 = 80% of the host's RAM).")
    pool_keep_alive_s: float = _setting(300.0, "An idle pool model unloads after this; a request's keep_alive "
                                        "overrides it (there 0 = once idle, negative = never).")
    pool_load_timeout_s: float = _setting(180.0, "An on-demand load not ready by then fails (its waiting requests get "
                                          "the error); `serve`'s eager models wait for theirs.")
    pool_failure_ttl_s: float = _setting(30.0, "A failed load is remembered (refused at once) this long.")
    responses_ttl_s: float = _setting(30 * 86400.0, "How long a stored Responses API response lives (30 days, as "
                                      "OpenAI's).")
    required_models: str = _setting("", "Comma-separated models /ready waits for a live worker of (beside those "
                                    "`serve` and `node --eager` were started with).")
    reasoning_format: str = _setting("deepseek", "A thinking model's `<think>` block: `deepseek` (its own field) or "
                                     "`none` (left in the content); a request's reasoning_format overrides.")
    reasoning_fields: str = _setting("both", "Where chat completions put the reasoning: `both` (`reasoning`, vLLM's "
                                     "name, and `reasoning_content`, DeepSeek's, with the same text), `reasoning` or "
                                     "`reasoning_content`; assistant messages may send back either.")
    causal_embeddings: int = _setting(0, "1: a worker of a generative (causal) model serves embeddings by pooling "
                                      "its hidden states (llama-server's --embeddings); 0: such requests are a 400 "
                                      "naming the model. Embedding models such as all-minilm-l6-v2 always embed.")
    stream_retention_s: float = _setting(60.0, "How long a finished stream can still be resumed (its journal and "
                                         "record kept in Redis; `Last-Event-ID`, Responses' `starting_after`); 0: "
                                         "they go when the stream ends.")
    orphan_grace_s: float = _setting(10.0, "How long a stream's job keeps running once nobody listens (its client "
                                     "disconnected, or its gateway died): a client that resumes it within this "
                                     "takes it over, else the job is cancelled. 0: cancelled at once.")
    fair_shares: int = _setting(1, "1: a gateway queues a job for a model's shared stream in its priority class's "
                                "fair queue, taken round-robin across tenants (API keys, or `X-LLMFleet-Tenant` / "
                                "`user` with keys off) weighted by token work and the key's weight; 0: straight "
                                "into the stream, first in, first out.")
    warm_up: int = _setting(1, "1: a worker runs two short chat requests of its own (template, prefill, sampling, a "
                            "stop string, streamed events; nothing sent) before it registers, so a client's first "
                            "request is as fast as its tenth; 0: it registers without them.")
    log_level: str = _setting("INFO", "The log level; logs carry ids and lengths, never prompt or completion text.")

    def __post_init__(self) -> None:
        if not self.redis_url.startswith(_REDIS_SCHEMES):
            _fail("redis_url", f"must start with one of {', '.join(_REDIS_SCHEMES)}")
        self._check_sentinels()
        if not 0 < self.port < 65536:
            _fail("port", "must be in 1..65535")
        if self.api_key is not None and not self.api_key.strip():
            _fail("api_key", "must not be blank (unset it to disable authentication)")
        for name in _POSITIVE_INTS:
            if getattr(self, name) < 1:
                _fail(name, "must be >= 1")
        for name in _POSITIVE_FLOATS:
            if not getattr(self, name) > 0:
                _fail(name, "must be > 0")
        for name in _NON_NEGATIVE:
            if not getattr(self, name) >= 0:
                _fail(name, "must be >= 0")
        for name in _LONGER_THAN_HEARTBEAT:
            if getattr(self, name) <= self.heartbeat_interval_s:
                _fail(name, "must be longer than LLMFLEET_HEARTBEAT_INTERVAL_S")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                _fail(name, f"must be one of {', '.join(choices)}")

    def _check_sentinels(self) -> None:
        try:
            sentinels = parse_sentinels(self.redis_sentinels)
        except ValueError as exc:
            _fail("redis_sentinels", str(exc))
            return
        if sentinels and self.redis_url.startswith("unix:"):
            _fail("redis_url", "must be redis:// or rediss:// with REDIS_SENTINELS (a primary is found over TCP)")
        if not self.redis_sentinel_master.strip():
            _fail("redis_sentinel_master", "must not be blank")
        if self.redis_cluster and sentinels:
            _fail("redis_cluster", "cannot be combined with REDIS_SENTINELS (a cluster fails over by itself)")
        if self.redis_cluster and self.redis_url.startswith("unix:"):
            _fail("redis_url", "must be redis:// or rediss:// with REDIS_CLUSTER=1 (cluster nodes are found over TCP)")

    @property
    def redis_target(self) -> RedisTarget:
        """Where every client of this process finds Redis: REDIS_URL, or the sentinels' primary."""
        return RedisTarget(self.redis_url, parse_sentinels(self.redis_sentinels), self.redis_sentinel_master,
                           cluster=bool(self.redis_cluster))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from `env` (default: os.environ); unset variables keep their defaults."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):
            var = ENV[item.name]
            raw = source.get(var)
            if raw is None or raw == "":
                continue
            parse = _PARSERS[item.name]
            try:
                values[item.name] = parse(raw.strip())
            except ValueError:
                raise SettingsError(f"{var}={raw!r}: expected {_EXPECTED[parse]}") from None
        return cls(**values)


ENV: dict[str, str] = {
    "redis_url": "REDIS_URL",
    "redis_sentinels": "REDIS_SENTINELS",
    "redis_sentinel_master": "REDIS_SENTINEL_MASTER",
    "redis_cluster": "REDIS_CLUSTER",
    "redis_max_connections": "LLMFLEET_REDIS_MAX_CONNECTIONS",
    "host": "LLMFLEET_HOST", "port": "LLMFLEET_PORT",
    "api_key": "LLMFLEET_API_KEY",
    "allow_open": "LLMFLEET_ALLOW_OPEN",
    "published_host": "LLMFLEET_PUBLISHED_HOST",
    "max_body_bytes": "LLMFLEET_MAX_BODY_BYTES",
    "max_prompt_chars": "LLMFLEET_MAX_PROMPT_CHARS",
    "max_tokens_limit": "LLMFLEET_MAX_TOKENS_LIMIT",
    "default_max_tokens": "LLMFLEET_DEFAULT_MAX_TOKENS",
    "public_metrics": "LLMFLEET_PUBLIC_METRICS",
    "max_n": "LLMFLEET_MAX_N",
    "max_embed_inputs": "LLMFLEET_MAX_EMBED_INPUTS",
    "queue_limit": "LLMFLEET_QUEUE_LIMIT",
    "stream_maxlen": "LLMFLEET_STREAM_MAXLEN",
    "request_timeout_s": "LLMFLEET_REQUEST_TIMEOUT_S",
    "deadline_grace_s": "LLMFLEET_DEADLINE_GRACE_S",
    "retry_after_s": "LLMFLEET_RETRY_AFTER_S",
    "sse_queued_after_s": "LLMFLEET_SSE_QUEUED_AFTER_S",
    "sse_keepalive_s": "LLMFLEET_SSE_KEEPALIVE_S",
    "heartbeat_interval_s": "LLMFLEET_HEARTBEAT_INTERVAL_S",
    "heartbeat_ttl_s": "LLMFLEET_HEARTBEAT_TTL_S",
    "lease_s": "LLMFLEET_LEASE_S",
    "max_deliveries": "LLMFLEET_MAX_DELIVERIES",
    "slots": "LLMFLEET_SLOTS", "threads": "LLMFLEET_THREADS",
    "kv_budget_mib": "LLMFLEET_KV_BUDGET_MIB",
    "kv_dtype": "LLMFLEET_KV_DTYPE",
    "prefix_cache": "LLMFLEET_PREFIX_CACHE",
    "kv_tier_mib": "LLMFLEET_KV_TIER_MIB",
    "kv_tier_dir": "LLMFLEET_KV_TIER_DIR",
    "kv_commit_ahead_mib": "LLMFLEET_KV_COMMIT_AHEAD_MIB",
    "max_batch_tokens": "LLMFLEET_MAX_BATCH_TOKENS",
    "max_prefill_tokens": "LLMFLEET_MAX_PREFILL_TOKENS",
    "model_memory_s": "LLMFLEET_MODEL_MEMORY_S",
    "worker_wait_s": "LLMFLEET_WORKER_WAIT_S",
    "registry_cache_s": "LLMFLEET_REGISTRY_CACHE_S",
    "drain_timeout_s": "LLMFLEET_DRAIN_TIMEOUT_S",
    "supervisor_key": "LLMFLEET_SUPERVISOR_KEY",
    "chat_template": "LLMFLEET_CHAT_TEMPLATE",
    "keys_file": "LLMFLEET_KEYS_FILE",
    "cors_origins": "LLMFLEET_CORS_ORIGINS",
    "any_model_name": "LLMFLEET_ANY_MODEL_NAME",
    "max_file_bytes": "LLMFLEET_MAX_FILE_BYTES",
    "max_batch_lines": "LLMFLEET_MAX_BATCH_LINES",
    "batch_concurrency": "LLMFLEET_BATCH_CONCURRENCY",
    "batch_lease_s": "LLMFLEET_BATCH_LEASE_S",
    "max_loras": "LLMFLEET_MAX_LORAS",
    "lora_memory_mib": "LLMFLEET_LORA_MEMORY_MIB",
    "prefix_placement": "LLMFLEET_PREFIX_PLACEMENT",
    "prefix_ttl_s": "LLMFLEET_PREFIX_TTL_S",
    "steal_after_s": "LLMFLEET_STEAL_AFTER_S",
    "placement_balance_abs": "LLMFLEET_PLACEMENT_BALANCE_ABS",
    "pool_max_loaded": "LLMFLEET_POOL_MAX_LOADED",
    "pool_memory_mib": "LLMFLEET_POOL_MEMORY_MIB",
    "pool_keep_alive_s": "LLMFLEET_POOL_KEEP_ALIVE_S",
    "pool_load_timeout_s": "LLMFLEET_POOL_LOAD_TIMEOUT_S",
    "pool_failure_ttl_s": "LLMFLEET_POOL_FAILURE_TTL_S",
    "responses_ttl_s": "LLMFLEET_RESPONSES_TTL_S",
    "stream_retention_s": "LLMFLEET_STREAM_RETENTION_S",
    "orphan_grace_s": "LLMFLEET_ORPHAN_GRACE_S",
    "required_models": "LLMFLEET_REQUIRED_MODELS",
    "reasoning_format": "LLMFLEET_REASONING_FORMAT",
    "reasoning_fields": "LLMFLEET_REASONING_FIELDS",
    "causal_embeddings": "LLMFLEET_CAUSAL_EMBEDDINGS",
    "warm_up": "LLMFLEET_WARM_UP",
    "fair_shares": "LLMFLEET_FAIR_SHARES",
    "log_level": "LLMFLEET_LOG_LEVEL",
}


def doc(name: str) -> str:
    """What a setting means: the text the configuration reference and the CLI's --help print."""
    return str(Settings.__dataclass_fields__[name].metadata["doc"])


def allowed(name: str) -> str:
    """The values a setting accepts, read from the same tables __post_init__ checks."""
    bounds = {"redis_url": "a URL starting " + " or ".join(_REDIS_SCHEMES), "port": "1..65535",
              "redis_sentinels": "comma-separated host:port (empty: none)", "redis_sentinel_master": "non-blank text",
              "api_key": "non-blank text", "slots": "an integer >= 0, or auto"}
    if name in bounds:
        return bounds[name]
    if name in _CHOICES:
        return "one of " + ", ".join(_CHOICES[name]) + (" (any case)" if name == "log_level" else "")
    if name in _LONGER_THAN_HEARTBEAT:
        return "> LLMFLEET_HEARTBEAT_INTERVAL_S"
    kind = "an integer" if Settings.__dataclass_fields__[name].type == "int" else "a number"
    if name in _POSITIVE_INTS:
        return f"{kind} >= 1"
    if name in _POSITIVE_FLOATS:
        return f"{kind} > 0"
    if name in _NON_NEGATIVE:
        return f"{kind} >= 0"
    return "any text"

def _fail(name: str, problem: str) -> None:
    raise SettingsError(f"{ENV[name]}: {problem}")


def _float(raw: str) -> float:
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(raw)
    return value


def _text(raw: str) -> str:
    return raw


def _upper(raw: str) -> str:
    return raw.upper()


def _lower(raw: str) -> str:
    return raw.lower()


def _slots(raw: str) -> int:
    return 0 if raw.strip().lower() == "auto" else int(raw)


_EXPECTED: dict[Callable[[str], Any], str] = {
    int: "an integer",
    _float: "a finite number",
    _text: "text",
    _upper: "text",
    _lower: "text",
    _slots: "an integer or auto",
}
_PARSE_BY_TYPE: dict[str, Callable[[str], Any]] = {"int": int, "float": _float, "str": _text, "str | None": _text}
_PARSERS: dict[str, Callable[[str], Any]] = {
    item.name: {"log_level": _upper, "slots": _slots, "reasoning_format": _lower,
                 "reasoning_fields": _lower}.get(item.name) or _PARSE_BY_TYPE[str(item.type)]
    for item in dataclasses.fields(Settings)
}
