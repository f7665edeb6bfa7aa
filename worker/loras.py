"""The LoRA adapters one worker holds for its model, kept in step with the desired set in Redis.

`POST /admin/loras` writes `llmfleet:{model}:loras` (name -> JSON source); every worker of the model reads that
hash (with its version, `llmfleet:{model}:loras-version`, which every write bumps) at start and every LORA_SYNC_S,
loads what it lacks and drops what was removed, then reports that version in its registry entry: the POST waits
for every worker to report its own write's version, so no worker's state from before the write counts. A load
that fails (bad file, wrong shapes, over the count or memory bound) is written to `llmfleet:{model}:lora-errors`
and the name is taken out of the desired set, so the gateway's POST answers with the error and no worker retries
it forever.
Dropping an adapter only forgets its name: requests already running hold the adapter object, so it is never
unloaded under a request (its memory is freed when the last of them ends).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from shared import keys
from shared.errors import InvalidRequest, LoraNotFound
from shared.messages import LoraRef
from worker.engine.errors import ModelLoadError
from worker.engine.lora import LoraAdapter, LoraUse, check_scale
from worker.engine.model import Model
from worker.models import ModelResolveError, resolve

log = logging.getLogger(__name__)

LORA_SYNC_S = 0.5  # how often a worker re-reads the desired set
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # no ':' or ',' (model:adapter, registry list)


def adapter_path(source: str) -> Path:
    """The local file of an adapter source: a .gguf path, or hf:owner/repo/file.gguf (downloaded once)."""
    if source.startswith("hf:"):
        return resolve(source, progress=False)
    path = Path(source).expanduser()
    if not path.is_file():
        raise ModelResolveError(f"no such adapter file: {path}")
    return path


class AdapterSet:
    """Loaded adapters by name, bounded by count and bytes; `sync` follows the desired set in Redis."""

    def __init__(self, model: Model, model_name: str, *, max_count: int, max_bytes: int) -> None:
        self.model = model
        self.model_name = model_name
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.loaded: dict[str, LoraAdapter] = {}
        self._sources: dict[str, str] = {}
        self._last_sync = 0.0
        self._sync_lock = threading.RLock()
        self.version = 0  # the desired-set version the loaded adapters follow (0 = not synced yet)

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the loaded adapters, sorted."""
        return tuple(sorted(self.loaded))

    def snapshot(self) -> tuple[int, tuple[str, ...]]:
        """(version, names) for the heartbeat: the version is read first, so it never runs ahead of the names
        (sync sets it after its loads)."""
        version = self.version
        return version, self.names

    @property
    def nbytes(self) -> int:
        """Bytes of the loaded adapters' weights."""
        return sum(adapter.nbytes for adapter in self.loaded.values())

    def load(self, name: str, source: str) -> LoraAdapter:
        """Load one adapter now (replacing one of the same name); ModelLoadError / ModelResolveError / ValueError
        when it cannot be loaded or would pass the bounds."""
        if not ADAPTER_NAME.match(name):
            raise ValueError(f"adapter name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
        others = {n: a for n, a in self.loaded.items() if n != name}
        if len(others) >= self.max_count:
            raise ValueError(f"{len(others)} adapters are loaded, the limit is {self.max_count} (LLMFLEET_MAX_LORAS)")
        adapter = self.model.load_adapter(adapter_path(source), name)
        total = adapter.nbytes + sum(a.nbytes for a in others.values())
        if total > self.max_bytes:
            raise ValueError(f"adapter {name} ({adapter.nbytes >> 20} MiB) would bring the adapters to "
                             f"{total >> 20} MiB, over LLMFLEET_LORA_MEMORY_MIB ({self.max_bytes >> 20} MiB)")
        self.loaded[name] = adapter
        self._sources[name] = source
        log.info("loaded LoRA adapter %s for %s (rank %d, %d KiB)", name, self.model_name, adapter.rank,
                 adapter.nbytes >> 10)
        return adapter

    def unload(self, name: str) -> None:
        """Forget an adapter: new requests cannot use it; running ones keep their reference until they end."""
        if self.loaded.pop(name, None) is not None:
            self._sources.pop(name, None)
            log.info("unloaded LoRA adapter %s of %s", name, self.model_name)

    def sync(self, redis: Redis, *, force: bool = False) -> None:
        """Follow the desired set (at most every LORA_SYNC_S unless forced); failed loads are reported in Redis."""
        with self._sync_lock:  # the job feeder's thread syncs; a job naming an unknown adapter forces one
            self._sync(redis, force=force)

    def _sync(self, redis: Redis, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_sync < LORA_SYNC_S:
            return
        self._last_sync = now
        try:
            pipe = redis.pipeline(transaction=True)
            pipe.get(keys.loras_version(self.model_name))
            pipe.hgetall(keys.loras_desired(self.model_name))
            raw_version, desired_raw = pipe.execute()
        except RedisError as exc:
            log.warning("cannot read the LoRA desired set of %s: %s", self.model_name, type(exc).__name__)
            return
        desired = {}
        for raw_name, raw_spec in desired_raw.items():
            name = raw_name.decode(errors="replace")
            try:
                desired[name] = str(json.loads(raw_spec)["source"])
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a malformed LoRA entry %s of %s", name, self.model_name)
        for name in [n for n in self.loaded if n not in desired]:
            self.unload(name)
        for name, source in sorted(desired.items()):
            if self._sources.get(name) == source:
                continue
            try:
                self.load(name, source)
            except (ModelLoadError, ModelResolveError, ValueError, OSError) as exc:
                self._report_failure(redis, name, desired_raw[name.encode()], str(exc))
        self.version = int(raw_version or 0)

    def _report_failure(self, redis: Redis, name: str, spec: bytes, message: str) -> None:
        """Record a failed load and take the name out of the desired set (only if it is still the same entry)."""
        log.warning("LoRA adapter %s of %s failed to load: %s", name, self.model_name, message)
        try:
            pipe = redis.pipeline(transaction=True)
            pipe.hset(keys.loras_errors(self.model_name), name, message)
            pipe.expire(keys.loras_errors(self.model_name), 3600)
            pipe.execute()
            if redis.hget(keys.loras_desired(self.model_name), name) == spec:
                redis.hdel(keys.loras_desired(self.model_name), name)
        except RedisError as exc:
            log.warning("cannot report the LoRA failure of %s: %s", name, type(exc).__name__)

    def resolve(self, refs: list[LoraRef], redis: Redis | None = None) -> tuple[LoraUse, ...]:
        """A job's adapters as (adapter, scale), scale 0 dropped; an unknown name is re-synced once, then a 404."""
        uses: list[LoraUse] = []
        for ref in refs:
            try:
                scale = check_scale(ref.scale)
            except ValueError as exc:
                raise InvalidRequest(str(exc), param="lora") from None
            adapter = self.loaded.get(ref.name)
            if adapter is None and redis is not None:
                self.sync(redis, force=True)  # it may have been added since the last sync
                adapter = self.loaded.get(ref.name)
            if adapter is None:
                raise LoraNotFound(f"The LoRA adapter '{ref.name}' is not loaded for model '{self.model_name}'",
                                   param="model")
            if scale != 0.0 and all(a is not adapter for a, _ in uses):
                uses.append((adapter, scale))
        return tuple(uses)
