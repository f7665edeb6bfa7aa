"""Real-process warm pools for the node agent's tests: a redis-server, node agents and gateways as processes
(llmfleet/local_cluster.py), with a catalogue of SmolLM2, a copy of it under another id, a corrupt file and a file
the engine refuses."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np

from llmfleet.local_cluster import LocalCluster
from tests.support.gguf_edit import edited_copy

REFUSED_TENSOR = "blk.0.attn_output.bias"  # llama.cpp's llama reads it; the engine does not, so it refuses the file

POOL_SETTINGS = {"LLMFLEET_SLOTS": "2", "LLMFLEET_KV_BUDGET_MIB": "32", "LLMFLEET_REGISTRY_CACHE_S": "0",
                 "LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5", "LLMFLEET_HEARTBEAT_TTL_S": "3", "LLMFLEET_LEASE_S": "4",
                 "LLMFLEET_THREADS": "1", "LLMFLEET_DRAIN_TIMEOUT_S": "30", "LLMFLEET_POOL_FAILURE_TTL_S": "60",
                 "LLMFLEET_LOG_LEVEL": "INFO", "OPENBLAS_NUM_THREADS": "1"}


def catalogue_files(smollm2: Path, folder: Path) -> list[str]:
    """`--model` entries: SmolLM2 by alias, a copy of its file as `second`, a truncated copy as `broken`, and a
    copy with a tensor the llama loader does not read as `refused` (honour or refuse: the engine refuses it)."""
    second, broken, refused = folder / "second.gguf", folder / "broken.gguf", folder / "refused.gguf"
    if not second.exists():
        shutil.copyfile(smollm2, second)
        broken.write_bytes(smollm2.read_bytes()[:1_000_000])
        edited_copy(smollm2, refused, add_tensors={REFUSED_TENSOR: np.zeros(576, np.float32)})
    return ["smollm2-135m", f"second={second}", f"broken={broken}", f"refused={refused}"]


class PoolCluster(LocalCluster):
    """Redis, node agents and gateways (start_node, start_gateway); close() ends them all."""

    def loads(self, model: str) -> int:
        """How many workers of `model` the node agents started (from their logs)."""
        return sum(log.read_text(errors="replace").count(f"started worker-{model}-") for log in self.node_logs)

    def status(self, model: str, base: str | None = None) -> dict:
        """The model's /admin/models entry."""
        data = httpx.get((base or self.gateways[0]) + "/admin/models", timeout=10).json()["data"]
        return next(m for m in data if m["id"] == model)

    def log_tails(self, lines: int = 60) -> str:
        """The last `lines` lines of every log in the cluster's folder (nodes, their workers, gateways): what a
        failed test shows."""
        parts = []
        for log in sorted(self.logdir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"---- {log.name} ----\n" + "\n".join(tail))
        return "\n".join(parts)

    def close(self, grace_s: float = 45.0) -> None:
        """SIGTERM everything (nodes drain their workers), SIGKILL what is left after grace_s, stop Redis."""
        super().close(grace_s)


def start_pool(folder: Path, **settings: str) -> PoolCluster:
    """Redis and the environment of a pool cluster (start nodes and gateways on it); RuntimeError without a
    redis-server."""
    return PoolCluster(folder, {**POOL_SETTINGS, **settings}).start_redis()  # type: ignore[return-value]
