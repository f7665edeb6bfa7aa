"""The warm pool's shared schema: a node agent's state hash `llmfleet:node:{id}`, which nodes write and
gateways read (see CONTRACT.md, "Warm pool"), and the parsing of a request's `keep_alive`.

Live node = the hash exists and `heartbeat` is within the node TTL. Its `catalogue` (JSON: model id -> source)
is what it may load; `models` (JSON: model id -> ModelSlot fields) what it runs or is loading now; `pinned`
(JSON list) the models it was started to serve (`serve` without --lazy, `node --eager`): /ready waits for them.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import asdict, dataclass, field

LOADING = "loading"
READY = "ready"
STOPPING = "stopping"
FAILED = "failed"
UNLOADED = "unloaded"
NODE_TTL_S = 5.0  # a node whose state is older than this is gone
MAX_CATALOGUE = 256  # models one node may list

_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True)
class ModelSlot:
    """One model on one node: its state, replicas, estimated memory (bytes) and last use (unix s)."""

    state: str
    replicas: int = 0
    memory: int = 0
    last_used: float = 0.0
    pinned: bool = False


@dataclass(frozen=True, kw_only=True)
class NodeState:
    """A node agent's state hash, as fields."""

    node_id: str
    heartbeat: float
    max_loaded: int
    memory_budget: int  # bytes
    catalogue: dict[str, str] = field(default_factory=dict)  # model id -> alias, .gguf path or hf: name
    models: dict[str, ModelSlot] = field(default_factory=dict)
    pinned: tuple[str, ...] = ()  # models this node serves from its start (loaded eagerly, never unloaded idle)
    host: str = field(default_factory=socket.gethostname)

    def to_hash(self) -> dict[str, str]:
        """The hash fields to HSET."""
        return {"heartbeat": repr(self.heartbeat), "max_loaded": str(self.max_loaded),
                "memory_budget": str(self.memory_budget), "host": self.host,
                "catalogue": json.dumps(self.catalogue, sort_keys=True),
                "models": json.dumps({m: asdict(s) for m, s in self.models.items()}, sort_keys=True),
                "pinned": json.dumps(sorted(self.pinned))}

    @classmethod
    def from_hash(cls, node_id: str, fields: dict[bytes, bytes]) -> NodeState | None:
        """Parse a node hash as HGETALL returns it; None when it is missing or malformed."""
        values = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()}
        try:
            catalogue = json.loads(values["catalogue"])
            models = {m: ModelSlot(**s) for m, s in json.loads(values["models"]).items()}
            pinned = json.loads(values.get("pinned", "[]"))
            if not isinstance(catalogue, dict) or not all(isinstance(v, str) for v in catalogue.values()):
                return None
            if not isinstance(pinned, list) or not all(isinstance(m, str) for m in pinned):
                return None
            return cls(node_id=node_id, heartbeat=float(values["heartbeat"]), max_loaded=int(values["max_loaded"]),
                       memory_budget=int(values["memory_budget"]), catalogue=catalogue, models=models,
                       pinned=tuple(pinned), host=values.get("host", ""))
        except (KeyError, ValueError, TypeError):
            return None


def parse_keep_alive(value: object) -> float | None:
    """Ollama's keep_alive: seconds (a number) or a duration ("5m", "1h", "30s", "-1"); negative = forever
    (-1.0), 0 = unload once idle. Raises ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("expected a number of seconds or a duration such as '5m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value.strip())):
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise ValueError("expected a number of seconds or a duration such as '5m'")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError("must be finite")
    return -1.0 if seconds < 0 else seconds
