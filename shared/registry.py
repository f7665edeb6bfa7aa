"""The worker registry entry: the one schema of the hash `llmfleet:worker:{id}` that workers write and
gateways read (see CONTRACT.md, "Registry").

Live = the hash exists, `model` is non-empty, `version` == WIRE_VERSION, `heartbeat` is within the TTL and
`state` is "ready" ("draining" workers finish what they hold but take nothing new).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from shared.messages import WIRE_VERSION

READY = "ready"
DRAINING = "draining"
STAT_PREFIX = "stat."  # hash fields of the worker's statistics (exported by every gateway's /metrics)


@dataclass(frozen=True, kw_only=True)
class RegistryEntry:
    """One worker's registry hash, as fields."""

    worker_id: str
    model: str
    slots: int
    heartbeat: float  # unix s of the write
    started: float  # unix s the worker started
    state: str = READY
    load: int = 0  # sequences in flight
    served: int = 0  # requests ended so far
    version: int = WIRE_VERSION
    host: str = field(default_factory=socket.gethostname)
    stats: dict[str, float] = field(default_factory=dict)  # scheduler counters and gauges, as `stat.<name>` fields
    loras: tuple[str, ...] = ()  # LoRA adapters loaded (names, comma-separated in the hash's `loras` field)
    loras_version: int = 0  # the desired-set version (`loras-version:{model}`) `loras` follows; 0 = never synced
    opens_thinking: bool = False  # its chat template's generation prompt ends with <think>: replies start in it
    opens_thinking_disabled: bool = False  # ... even with enable_thinking=false (a template that ignores it)
    harmony: bool = False  # its chat template writes OpenAI's harmony format (gpt-oss): replies are channels
    kv_tier: str = ""  # its host KV tier, "host:directory" ("" = none): workers with the same one share KV blocks

    def to_hash(self) -> dict[str, str | int | float]:
        """The hash fields to HSET (the worker id is the key, not a field)."""
        fields: dict[str, str | int | float] = {
            "model": self.model, "slots": self.slots, "version": self.version, "heartbeat": self.heartbeat,
            "started": self.started, "state": self.state, "host": self.host, "load": self.load, "served": self.served,
            "loras": ",".join(self.loras), "loras_version": self.loras_version,
            "opens_thinking": int(self.opens_thinking), "opens_thinking_disabled": int(self.opens_thinking_disabled),
            "harmony": int(self.harmony), "kv_tier": self.kv_tier}
        fields.update({STAT_PREFIX + name: value for name, value in self.stats.items()})
        return fields

    @classmethod
    def from_hash(cls, worker_id: str, fields: dict[bytes, bytes]) -> RegistryEntry | None:
        """Parse a registry hash as HGETALL returns it; None when it is missing or malformed."""
        values = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()}
        try:
            heartbeat = float(values["heartbeat"])
            return cls(worker_id=worker_id, model=values["model"], slots=int(values.get("slots", "0")),
                       heartbeat=heartbeat, started=float(values.get("started", heartbeat)),
                       state=values.get("state", READY), load=int(values.get("load", "0")),
                       served=int(values.get("served", "0")), version=int(values["version"]),
                       host=values.get("host", ""),
                       loras=tuple(name for name in values.get("loras", "").split(",") if name),
                       loras_version=int(values.get("loras_version", "0")),
                       opens_thinking=values.get("opens_thinking", "0") == "1",
                       opens_thinking_disabled=values.get("opens_thinking_disabled", "0") == "1",
                       harmony=values.get("harmony", "0") == "1", kv_tier=values.get("kv_tier", ""),
                       stats={k.removeprefix(STAT_PREFIX): float(v) for k, v in values.items()
                              if k.startswith(STAT_PREFIX)})
        except (KeyError, ValueError):
            return None

    def is_live(self, now: float, ttl_s: float) -> bool:
        """Whether the gateway may send this worker's model new jobs on its account."""
        return self.version == WIRE_VERSION and self.state == READY and bool(self.model) and self.heartbeat >= now - ttl_s
