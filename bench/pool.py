"""Warm-pool benchmark: cold start (a request for an unloaded model -> its first token) against a warm first
token, in one run, on real processes: a redis-server, `llmfleet node --max-loaded 1` with SmolLM2 and a copy of
its file under another id, and a gateway. The two models alternate, so every first request of a round evicts
the other model and loads its own (cold); the next request of the same model is warm.

Per round it times, with the unmodified openai client streaming a completion: cold first token, then
--warm warm first tokens. It prints the medians, their ratio, and where a cold start goes (the worker's own
load time, from its log, versus the rest: eviction, process start, registration, the node's tick).
Run: python bench/pool.py [--rounds 4] [--warm 3]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmfleet.local_cluster import LocalCluster  # noqa: E402
from worker.models import pull  # noqa: E402

LOADED = re.compile(r"loaded \S+ in ([0-9.]+)s")
# short liveness settings, one thread per worker, at most one model loaded (the node's --max-loaded 1)
POOL_SETTINGS = {"LLMFLEET_SLOTS": "2", "LLMFLEET_KV_BUDGET_MIB": "32", "LLMFLEET_REGISTRY_CACHE_S": "0",
                 "LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5", "LLMFLEET_HEARTBEAT_TTL_S": "3", "LLMFLEET_LEASE_S": "4",
                 "LLMFLEET_THREADS": "1", "LLMFLEET_DRAIN_TIMEOUT_S": "30", "LLMFLEET_LOG_LEVEL": "INFO",
                 "OPENBLAS_NUM_THREADS": "1"}


def first_token_s(base_url: str, model: str) -> float:
    """Seconds from sending a streaming completion to its first non-empty text."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)
    started = time.perf_counter()
    first = None
    for chunk in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                                           temperature=0, stream=True):
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"{model}: no token came")
    return first


def main() -> int:
    """Run the rounds and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="cold starts (the two models alternate)")
    parser.add_argument("--warm", type=int, default=3, help="warm requests after each cold one")
    args = parser.parse_args()
    smollm2 = pull("smollm2-135m", progress=True)
    with tempfile.TemporaryDirectory(prefix="llmfleet-pool-bench-") as tmp:
        folder = Path(tmp)
        shutil.copyfile(smollm2, folder / "second.gguf")  # the same weights under another id
        cluster = LocalCluster(folder, POOL_SETTINGS, tied_to_parent=True).start_redis()
        try:
            cluster.start_node(["smollm2-135m", f"second={folder / 'second.gguf'}"], "--max-loaded", "1")
            base = cluster.start_gateway()
            cluster.wait_ready(nodes=1)
            cold, warm = [], []
            for i in range(args.rounds):
                model = ("smollm2-135m", "second")[i % 2]
                cold.append(first_token_s(base, model))
                warm += [first_token_s(base, model) for _ in range(args.warm)]
                print(f"round {i + 1} ({model}): cold {cold[-1]:.2f}s, warm {statistics.median(warm[-args.warm:]):.3f}s",
                      flush=True)
            loads = [float(m) for m in LOADED.findall(cluster.node_logs[0].read_text())]
        finally:
            cluster.close(grace_s=45)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    load_s = statistics.median(loads) if loads else float("nan")
    print(f"\ncold start -> first token: median {cold_s:.2f}s (min {min(cold):.2f}, max {max(cold):.2f}) over {len(cold)}")
    print(f"warm first token:          median {warm_s:.3f}s (min {min(warm):.3f}, max {max(warm):.3f}) over {len(warm)}")
    print(f"cold / warm: {cold_s / warm_s:.0f}x")
    print(f"of a cold start, the worker's own load (GGUF read + dequantize): median {load_s:.2f}s; the rest "
          f"(eviction, process start and imports, registration, the node's tick): ~{cold_s - load_s - warm_s:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
