"""The host KV tier's failover aim (issue 41): N streams of long prompts decoding on one worker, kill -9 of that worker
mid-decode; a second worker on the same host takes the streams over. With the tier it copies the dead worker's blocks
(prompt and generated tokens) and prefills only the tails; without (LLMFLEET_KV_TIER_MIB=0, the baseline, same run)
it re-prefills every conversation.

For each mode, one process cluster (Redis, a gateway, worker A; worker B started once every stream is decoding, then
A killed): the detection time (kill to B's claim of the last stream, read from the streams' pending entries every
20 ms), the longest silence a client saw, silence minus detection (what the resume itself cost), and whether every
text equals an undisturbed run's (the same requests again, on B). The aim: silence <= detection + 0.5 s, text
byte-identical.
Run: python bench/kv_failover.py [--model PATH] [--streams 8] [--tokens 2000]   (about 15 minutes for the synthetic 1B)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kv_tier import system_prompt  # noqa: E402
from llmfleet.local_cluster import LocalCluster, wait_until  # noqa: E402
from shared import keys  # noqa: E402
from worker.models import model_id  # noqa: E402

SETTINGS = {"LLMFLEET_REGISTRY_CACHE_S": "0", "LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5", "LLMFLEET_HEARTBEAT_TTL_S": "2",
            "LLMFLEET_LEASE_S": "30"}


class Stream(threading.Thread):
    """One streaming completion: chunk arrival times and text."""

    def __init__(self, base: str, model: str, prompt: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.base, self.model, self.prompt, self.max_tokens = base, model, prompt, max_tokens
        self.times: list[float] = []
        self.text = ""
        self.error = ""

    def run(self) -> None:
        client = openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=1800)
        try:
            for chunk in client.completions.create(model=self.model, prompt=self.prompt, max_tokens=self.max_tokens,
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True}):
                self.times.append(time.monotonic())
                self.text += chunk.choices[0].text if chunk.choices else ""
        except openai.APIError as exc:
            self.error = str(exc)

    def silence_after(self, moment: float) -> float:
        """The longest gap between chunks that ends after `moment`."""
        return max((b - a for a, b in zip(self.times, self.times[1:]) if b > moment), default=float("nan"))

    def around(self, moment: float) -> tuple[float, float]:
        """(seconds from the last chunk before `moment` to it, seconds from it to the first chunk after)."""
        before = max((t for t in self.times if t <= moment), default=float("nan"))
        after = min((t for t in self.times if t > moment), default=float("nan"))
        return moment - before, after - moment


def holders(client: Any, model: str) -> list[str]:
    """The consumer of every pending job entry of the model, over its shared and per-worker streams."""
    placed = sorted(w.decode() for w in client.smembers(keys.placed_workers(model)))
    streams = [*keys.jobs_streams(model), *(s for w in placed for s in keys.worker_jobs_streams(model, w))]
    found: list[str] = []
    for stream in streams:
        try:
            pending = client.xpending_range(stream, keys.JOBS_GROUP, "-", "+", 1000) if client.exists(stream) else []
        except redis.ResponseError:  # NOGROUP: the survivor forgot the dead worker's emptied stream meanwhile
            pending = []
        found += [entry["consumer"].decode() for entry in pending]
    return found


def run_mode(args: argparse.Namespace, tier_mib: str) -> dict[str, Any]:
    """One cluster: the streams on A, B started, A killed; returns the measurements."""
    tier_dir = Path(tempfile.mkdtemp(prefix="llmfleet-kv-failover-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    logdir = Path(tempfile.mkdtemp(prefix="kv-failover-bench-"))
    settings = {**SETTINGS, "LLMFLEET_KV_TIER_DIR": str(tier_dir), "LLMFLEET_KV_TIER_MIB": tier_mib}
    cluster = LocalCluster(logdir, settings, model=args.model)
    served = model_id(args.model)
    prompts = [system_prompt(10 + i, args.tokens) + f" Question {i}?" for i in range(args.streams)]
    try:
        cluster.start(1)
        client = cluster.client
        Stream(cluster.base_url, served, "Warm up the kernels.", 4).run()
        streams = [Stream(cluster.base_url, served, p, args.max_tokens) for p in prompts]
        for stream in streams:
            stream.start()
        wait_until(lambda: all(s.times or s.error for s in streams), 1800, "every stream's first token")
        cluster.start_worker(1)
        cluster.wait_ready(2)
        counts = [len(s.times) for s in streams]
        wait_until(lambda: all(len(s.times) >= c + 16 or s.error for s, c in zip(streams, counts)), 600,
                   "16 more tokens of every stream")
        (victim,) = set(holders(client, served))
        killed_at = time.monotonic()
        os.kill(cluster.workers[cluster.worker_index(victim)].pid, signal.SIGKILL)
        wait_until(lambda: victim not in holders(client, served), 120, "the survivor's claims", interval_s=0.02)
        detection = time.monotonic() - killed_at
        for stream in streams:
            stream.join(timeout=1800)
        again = [Stream(cluster.base_url, served, p, args.max_tokens) for p in prompts]
        for stream in again:
            stream.start()
        for stream in again:
            stream.join(timeout=1800)
        claimed_at = killed_at + detection
        return {"detection": detection, "silence": max(s.silence_after(killed_at) for s in streams),
                "before_kill": max(s.around(killed_at)[0] for s in streams),
                "after_claim": max(s.around(claimed_at)[1] for s in streams),
                "errors": [s.error for s in [*streams, *again] if s.error],
                "same": sum(a.text == b.text for a, b in zip(streams, again)),
                "hits": [float(e.get(b"stat.kv_tier_tokens_hit", b"0")) for e in cluster.worker_entries()]}
    finally:
        cluster.close()
        shutil.rmtree(tier_dir, ignore_errors=True)


def main() -> None:
    """Both modes, tier first; one line each and the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(Path("~/.cache/llmfleet-peers/models/synthetic-llama-1b-Q4_K_M.gguf")
                                              .expanduser()))
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--modes", default="tier,no tier", help="which runs, comma-separated (the baseline: no tier)")
    args = parser.parse_args()
    print(f"== {Path(args.model).name}: {args.streams} streams of ~{args.tokens}-token prompts, kill -9 of their "
          f"worker mid-decode; LLMFLEET_HEARTBEAT_TTL_S=2; load average {os.getloadavg()[0]:.2f}", flush=True)
    results = {}
    for mode, mib in [(m, "2048" if m == "tier" else "0") for m in args.modes.split(",")]:
        results[mode] = got = run_mode(args, mib)
        print(f"{mode:8s}: detection {got['detection']:.2f}s, longest silence {got['silence']:.2f}s, silence - "
              f"detection {got['silence'] - got['detection']:.2f}s (last chunk before the kill up to "
              f"{got['before_kill']:.2f}s earlier, first chunk after the claims up to {got['after_claim']:.2f}s "
              f"later); texts equal {got['same']}/{args.streams}; "
              f"tier tokens hit {max(got['hits'], default=0):.0f}; errors {len(got['errors'])}", flush=True)
    if len(results) < 2:
        return
    tier, cold = results["tier"], results["no tier"]
    print(f"resume cost with the tier {tier['silence'] - tier['detection']:.2f}s vs a re-prefill "
          f"{cold['silence'] - cold['detection']:.2f}s (aim: <= 0.5 s beyond detection)")


if __name__ == "__main__":
    main()
