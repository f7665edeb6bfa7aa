"""Frozen settings read once from the environment; bad values fail fast with the variable's name."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_KV_DTYPES = ("float16", "float32")  # worker/engine/kv_pool.py KV_DTYPES
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


class SettingsError(ValueError):
    """A setting has a value llmfleet cannot use; the message names the environment variable."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """All knobs of gateway and workers; see ENV for the environment variable of each field."""

    redis_url: str = field(default="redis://localhost:6379/0", repr=False)  # may hold a password
    redis_max_connections: int = 64  # the gateway's connection pool; requests wait for a free connection
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = field(default=None, repr=False)  # when set, every /v1 request needs "Authorization: Bearer <key>"
    allow_open: int = 0  # 1: a gateway other hosts can reach may run without an API key (gateway/http/exposure.py)
    published_host: str | None = None  # where clients reach the gateway when a container publishes it (compose)
    max_body_bytes: int = 1024 * 1024
    max_prompt_chars: int = 400_000  # over all messages / prompts of one request
    max_tokens_limit: int = 4096  # the largest max_tokens a request may ask for
    public_metrics: int = 1  # 0: /metrics needs an API key like the API (when keys are configured)
    default_max_tokens: int = 1024  # a chat request without max_tokens (workers apply it; 0 = up to the context)
    max_n: int = 16  # choices per request (n times the number of prompts)
    max_embed_inputs: int = 2048
    queue_limit: int = 256  # waiting (not yet taken) jobs per model before 429
    stream_maxlen: int = 10_000  # approximate cap of each job stream (safety net)
    request_timeout_s: float = 600.0  # deadline = created + this
    deadline_grace_s: float = 1.0  # the gateway waits this long past the deadline for the worker's error
    retry_after_s: float = 2.0  # Retry-After of 429 / 503
    sse_queued_after_s: float = 0.25  # a stream whose work has not started by then opens with ": queued"
    sse_keepalive_s: float = 1.0  # an SSE comment after this long without an event (queued, failover, Redis pause)
    heartbeat_interval_s: float = 0.5  # workers refresh their registry entry this often
    heartbeat_ttl_s: float = 2.5  # a worker without a heartbeat for this long is dead: its jobs fail over (within
    # this + 0.5 s, worker/serve/job_feeder.py RECLAIM_EVERY_S); a worker stalled this long loses its jobs (fenced, resumed)
    lease_s: float = 30.0  # a job idle this long in the pending list may be reclaimed (XAUTOCLAIM)
    max_deliveries: int = 3  # a job taken over after this many deliveries without an ack is dead-lettered
    slots: int = 0  # sequences a worker runs at once; 0 ("auto") = derived from the KV budget (up to 64)
    threads: int = 0  # BLAS threads of a worker; 0 = every core (`serve` splits the cores among its workers)
    kv_budget_mib: float = 1024.0  # a worker's KV cache for all its sequences; over it, it preempts
    kv_dtype: str = "float16"  # the KV cache's keys and values: float16 (half the bytes) or float32
    prefix_cache: int = 1  # 1: full prompt blocks stay in the KV pool's free space for reuse; 0: off
    max_batch_tokens: int = 2048  # tokens (decodes + prefill chunks) in one forward step
    max_prefill_tokens: int = 512  # the largest prefill chunk of one sequence in one step
    model_memory_s: float = 86_400.0  # a model stays 'known' (503, not 404) this long after its last worker
    registry_cache_s: float = 1.0  # the gateway reuses a worker-registry read this long (0.1 s for /ready and a model it lacks)
    drain_timeout_s: float = 60.0  # on SIGTERM/SIGINT: how long open streams may take to finish
    supervisor_key: str | None = None  # set by `serve`: the Redis hash /ready reads the supervisor's state from
    chat_template: str | None = None  # a jinja2 chat template file workers use instead of the model's own
    keys_file: str | None = None  # API keys managed by `llmfleet keys` (each with its own limits)
    cors_origins: str = ""  # comma-separated origins browsers may call the API from ("*" = any; empty = no CORS)
    any_model_name: int = 0  # 1: with exactly one model served, any model name is served by it (as llama-server)
    max_file_bytes: int = 50 * 1024 * 1024  # an uploaded file (/v1/files); over it: 413
    max_batch_lines: int = 50_000  # requests in one batch input file (OpenAI's limit); over it: 400
    batch_concurrency: int = 8  # requests of one batch a batch runner has in flight at once
    batch_lease_s: float = 10.0  # a batch whose runner stopped renewing its lease this long is resumed by another
    max_loras: int = 8  # LoRA adapters loaded per model (POST /admin/loras past it: 409)
    lora_memory_mib: float = 512.0  # their weights per worker, all together (a load past it fails, naming it)
    prefix_placement: int = 1  # 1: the gateway places requests on the worker that has their prompt prefix cached
    prefix_ttl_s: float = 300.0  # how long the gateway remembers which worker got a prompt prefix
    steal_after_s: float = 1.0  # a job waiting this long on a busy worker's stream may be taken by an idle one
    placement_balance_abs: int = 8  # loads (running + placed) differing by more than this: shortest queue wins
    pool_max_loaded: int = 0  # a node agent's loaded workers at most (0 = as many as the memory budget allows)
    pool_memory_mib: float = 0.0  # a node agent's memory budget for its workers (0 = 80% of the host's RAM)
    pool_keep_alive_s: float = 300.0  # an idle pool model unloads after this (a request's keep_alive overrides)
    pool_load_timeout_s: float = 180.0  # a load not ready by then fails (its waiting requests get the error)
    pool_failure_ttl_s: float = 30.0  # a failed load is remembered (refused at once) this long
    responses_ttl_s: float = 30 * 86400.0  # a stored Responses API response lives this long (OpenAI: 30 days)
    required_models: str = ""  # comma-separated: /ready waits for a live worker of each (beside nodes' pinned ones)
    reasoning_format: str = "deepseek"  # a thinking model's <think> block: "deepseek" (own field) or "none" (in content)
    reasoning_fields: str = "both"  # chat completions carry the reasoning as `reasoning`, `reasoning_content` or both
    causal_embeddings: int = 0  # 1: a worker of a generative (causal) model serves embeddings by pooling its hidden
    # states (llama-server's --embeddings, vLLM's --task embed); 0: such requests are a 400 naming the model
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not self.redis_url.startswith(_REDIS_SCHEMES):
            _fail("redis_url", f"must start with one of {', '.join(_REDIS_SCHEMES)}")
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
        for name in ("deadline_grace_s", "registry_cache_s", "prefix_cache", "slots", "threads", "default_max_tokens",
                     "public_metrics", "any_model_name", "prefix_placement", "placement_balance_abs", "pool_max_loaded",
                     "pool_memory_mib", "pool_keep_alive_s", "allow_open", "causal_embeddings"):
            if not getattr(self, name) >= 0:
                _fail(name, "must be >= 0")
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            _fail("heartbeat_ttl_s", "must be longer than LLMFLEET_HEARTBEAT_INTERVAL_S")
        if self.lease_s <= self.heartbeat_interval_s:
            _fail("lease_s", "must be longer than LLMFLEET_HEARTBEAT_INTERVAL_S")
        if self.log_level not in _LOG_LEVELS:
            _fail("log_level", f"must be one of {', '.join(_LOG_LEVELS)}")
        if self.reasoning_format not in REASONING_FORMATS:
            _fail("reasoning_format", f"must be one of {', '.join(REASONING_FORMATS)}")
        if self.reasoning_fields not in REASONING_FIELDS:
            _fail("reasoning_fields", f"must be one of {', '.join(REASONING_FIELDS)}")
        if self.kv_dtype not in _KV_DTYPES:
            _fail("kv_dtype", f"must be one of {', '.join(_KV_DTYPES)}")

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
    "redis_max_connections": "LLMFLEET_REDIS_MAX_CONNECTIONS",
    "host": "LLMFLEET_HOST",
    "port": "LLMFLEET_PORT",
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
    "slots": "LLMFLEET_SLOTS",
    "threads": "LLMFLEET_THREADS",
    "kv_budget_mib": "LLMFLEET_KV_BUDGET_MIB",
    "kv_dtype": "LLMFLEET_KV_DTYPE",
    "prefix_cache": "LLMFLEET_PREFIX_CACHE",
    "max_batch_tokens": "LLMFLEET_MAX_BATCH_TOKENS",
    "max_prefill_tokens": "LLMFLEET_MAX_PREFILL_TOKENS",
    "model_memory_s": "LLMFLEET_MODEL_MEMORY_S",
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
    "required_models": "LLMFLEET_REQUIRED_MODELS",
    "reasoning_format": "LLMFLEET_REASONING_FORMAT",
    "reasoning_fields": "LLMFLEET_REASONING_FIELDS",
    "causal_embeddings": "LLMFLEET_CAUSAL_EMBEDDINGS",
    "log_level": "LLMFLEET_LOG_LEVEL",
}


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
