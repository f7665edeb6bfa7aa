"""The host KV tier's TTFT aims (issue 41): a long shared system prompt prefilled on worker A, then the same prompt on
worker B (A stopped: B never computed it), then after kill -9 of B on a freshly started worker C; each TTFT against a
cold prefill of a prompt of the same length, the last one measured on C in the same run.

One process cluster (Redis, a gateway, workers of --model with LLMFLEET_THREADS=1), its tier in a fresh directory
under /dev/shm. Each request is a streaming completion (temperature 0, 4 tokens); TTFT is the client's time from
sending to the first content chunk. The aim: tier hit and restart TTFT <= 0.15 x cold.
Run: python bench/kv_tier.py [--tokens 4000] [--model smollm2-135m]   (about a minute for SmolLM2 at 2,000 tokens)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmfleet.local_cluster import LocalCluster, wait_until  # noqa: E402
from worker.models import model_id  # noqa: E402

WORDS_TEXT = ("harbour ship tide cargo crane pilot berth anchor weather storm wind wave crew captain dock quay "
              "manifest customs container vessel route chart beacon lighthouse signal radio channel buoy draft keel hull deck rope "
              "winch ballast fuel engine schedule arrival departure delay inspection permit fee invoice tariff")
WORDS = WORDS_TEXT.split()


def system_prompt(seed: int, tokens: int) -> str:
    """About `tokens` tokens of seeded words (SmolLM2's tokenizer: ~1.08 tokens a word)."""
    rng = random.Random(seed)
    return f"You are assistant {seed}. Notes: " + " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.08)))


def ttft(base: str, model: str, prompt: str) -> tuple[float, int, int]:
    """(seconds to the first content chunk, prompt tokens, cached tokens) of one streaming completion."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    started, first, usage = time.perf_counter(), None, None
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - started
        usage = chunk.usage or usage
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return first or float("nan"), usage.prompt_tokens, cached


def wait_for_new_worker(cluster: LocalCluster, after: float) -> None:
    """Until the only registered worker is one that started after `after` (the killed one's entry has expired)."""
    def fresh() -> bool:
        entries = cluster.worker_entries()
        return len(entries) == 1 and float(entries[0][b"started"]) > after and b"stat.kv_tier_bytes_total" in entries[0]
    wait_until(fresh, 300, "a fresh worker")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    tier_dir = Path(tempfile.mkdtemp(prefix="llmfleet-kv-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    logdir = Path(tempfile.mkdtemp(prefix="kv-tier-bench-"))
    settings = {"LLMFLEET_THREADS": "1", "LLMFLEET_REGISTRY_CACHE_S": "0", "LLMFLEET_KV_TIER_DIR": str(tier_dir),
                "LLMFLEET_HEARTBEAT_TTL_S": "2", "LLMFLEET_MAX_PREFILL_TOKENS": "512"}
    cluster = LocalCluster(logdir, settings, model=args.model)
    served = model_id(args.model)  # a path is served under its file's stem
    shared = system_prompt(1, args.tokens)
    try:
        cluster.start(1)
        base = cluster.base_url
        ttft(base, served, "Warm up the kernels.")
        cold_a, n, _ = ttft(base, served, shared + " Question one?")
        print(f"cold prefill on A: {n} prompt tokens, TTFT {cold_a:.2f}s")
        cluster.start_worker(1)
        cluster.wait_ready(2)
        cluster.stop(cluster.workers[0])
        wait_for_new_worker(cluster, 0)
        tier_b, _, cached = ttft(base, served, shared + " Question two?")
        print(f"same prefix on B (A stopped): TTFT {tier_b:.2f}s ({cached} tokens from the tier) = "
              f"{tier_b / cold_a:.3f} x cold")
        killed = time.time()
        os.kill(cluster.workers[1].pid, signal.SIGKILL)
        cluster.workers[1].wait()
        cluster.start_worker(2)
        wait_for_new_worker(cluster, killed)
        restart, _, cached = ttft(base, served, shared + " Question three?")
        cold_c, _, _ = ttft(base, served, system_prompt(2, args.tokens) + " Question four?")
        print(f"after kill -9 and a restart: TTFT {restart:.2f}s ({cached} tokens from the tier) = "
              f"{restart / cold_c:.3f} x a cold prefill on the same worker ({cold_c:.2f}s)")
        used = sum(f.stat().st_blocks * 512 for f in tier_dir.glob("*.kvtier"))
        print(f"tier file memory: {used / 2**20:.1f} MiB")
    finally:
        cluster.close()
        shutil.rmtree(tier_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
