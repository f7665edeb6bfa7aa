"""Prefix-aware placement benchmark: 2 workers, 8 system prompts of ~1,000 tokens shared by 64 requests.

Each round starts Redis, a gateway and two SmolLM2 workers (1 thread each, cold caches), then sends --requests
streaming chat completions from --concurrency clients (closed loop: each sends its next request when the last
one ended). Request i uses system prompt i % 8 (in a seeded shuffled order) and its own user question, max_tokens
--max-tokens with ignore_eos. Rounds alternate placement off (LLMFLEET_PREFIX_PLACEMENT=0: every job on the shared
stream, whichever worker is free takes it) and on, --rounds times each; per round it prints TTFT p50/p95 (client
side: request sent to first content token), aggregate throughput (completion tokens / wall, and prompt+completion
tokens / wall), the share of prompt tokens the workers found in their prefix cache, and the on/off ratios.
Run: python bench/placement.py [--requests 64] [--concurrency 8] [--rounds 1] [--kv-budget-mib 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_processes import PY, Cluster  # noqa: E402

MODEL = "smollm2-135m"
PROMPTS = 8
WORDS_TEXT = ("harbour ship tide cargo crane pilot berth anchor weather storm wind wave crew captain dock quay manifest "
         "customs container vessel route chart beacon lighthouse signal radio channel buoy draft keel hull deck "
         "rope winch ballast fuel engine schedule arrival departure delay inspection permit fee invoice tariff "
         "warehouse forklift gate truck rail barge tug towing mooring bollard fender dredging depth sonar survey "
         "safety drill fire alarm first aid report log entry shift handover duty officer harbourmaster agent "
         "broker shipper consignee bill lading seal reefer temperature hazardous label class pallet crate bulk "
         "grain coal ore oil gas chemical liquid tank pump hose valve pressure gauge meter reading record note")
WORDS = WORDS_TEXT.split()


def system_prompt(index: int, words: int) -> str:
    """A distinct system prompt of `words` seeded random words (~1.2 tokens each with SmolLM2's tokenizer)."""
    rng = random.Random(1000 + index)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"You are harbour assistant number {index}. Use these notes: {body}."


@dataclass
class Outcome:
    """What one request saw."""

    ttft_s: float | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None


async def one_request(client: httpx.AsyncClient, url: str, system: str, question: str, max_tokens: int) -> Outcome:
    """One streaming chat completion with usage; the time to its first content token."""
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    started = time.monotonic()
    ttft, usage, error = None, None, None
    try:
        async with client.stream("POST", url, json=body) as reply:
            if reply.status_code != 200:
                return Outcome(None, 0, 0, 0, f"HTTP {reply.status_code}: {(await reply.aread())[:120]!r}")
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = str(chunk["error"])[:120]
                if ttft is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    ttft = time.monotonic() - started
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    if usage is None:
        return Outcome(ttft, 0, 0, 0, error or "no usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Outcome(ttft, usage["prompt_tokens"], cached, usage["completion_tokens"], error)


async def load(url: str, requests: int, concurrency: int, words: int, max_tokens: int) -> tuple[list[Outcome], float]:
    """`requests` requests from `concurrency` closed-loop clients; their outcomes and the wall time."""
    order = [i % PROMPTS for i in range(requests)]
    random.Random(7).shuffle(order)
    prompts = [system_prompt(i, words) for i in range(PROMPTS)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for number in range(requests):
        queue.put_nowait(number)
    outcomes: list[Outcome] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            number = queue.get_nowait()
            question = f"Request {number}: what should the night shift check first?"
            outcomes.append(await one_request(client, url + "/chat/completions", prompts[order[number]], question,
                                              max_tokens))

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=30), limits=limits) as client:
        started = time.monotonic()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        return outcomes, time.monotonic() - started


def run_round(placement: bool, args: argparse.Namespace) -> dict[str, float]:
    """One cold cluster with placement on or off; returns its numbers."""
    saved = dict(os.environ)
    os.environ.update({"LLMFLEET_PREFIX_PLACEMENT": "1" if placement else "0", "LLMFLEET_SLOTS": str(args.slots),
                       "LLMFLEET_KV_BUDGET_MIB": str(args.kv_budget_mib), "LLMFLEET_REQUEST_TIMEOUT_S": "1200"})
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="llmfleet-placement-")), queue_limit=256)
    try:
        cluster.start()
        workers = [cluster.spawn(f"worker{i}", [PY, "-m", "llmfleet.cli", "worker", "--model", MODEL,
                                                "--threads", "1"]) for i in range(2)]
        for worker in workers:
            cluster.wait_model(MODEL, worker, 300)
        time.sleep(1.5)  # both heartbeats published
        outcomes, wall = asyncio.run(load(cluster.url, args.requests, args.concurrency, args.words, args.max_tokens))
    finally:
        cluster.close()
        os.environ.clear()
        os.environ.update(saved)
    ok = [o for o in outcomes if o.error is None and o.ttft_s is not None]
    ttfts = sorted(o.ttft_s for o in ok if o.ttft_s is not None)
    prompt = sum(o.prompt_tokens for o in ok)
    completion = sum(o.completion_tokens for o in ok)

    def pct(q: float) -> float:
        return ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")

    numbers = {"ok": len(ok), "failed": len(outcomes) - len(ok), "ttft50": pct(0.5), "ttft95": pct(0.95),
               "gen_tps": completion / wall, "all_tps": (prompt + completion) / wall, "wall": wall,
               "cached": sum(o.cached_tokens for o in ok) / max(1, prompt),
               "prompt_mean": statistics.mean(o.prompt_tokens for o in ok) if ok else 0.0}
    label = "on" if placement else "off"
    print(f"{label:<5} {numbers['ok']:>4} {numbers['failed']:>6} {numbers['ttft50']:>7.2f} {numbers['ttft95']:>7.2f} "
          f"{numbers['gen_tps']:>8.1f} {numbers['all_tps']:>8.0f} {numbers['cached']:>7.0%} {numbers['wall']:>7.1f}",
          flush=True)
    failures = [o.error for o in outcomes if o.error]
    if failures:
        print(f"  first failure: {failures[0]}", flush=True)
    return numbers


def main() -> None:
    """Alternate off and on rounds; print each and the on/off ratios of the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--words", type=int, default=720, help="words per system prompt (~1,000 tokens)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--kv-budget-mib", type=float, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.requests} requests over {PROMPTS} system prompts ({args.words} words each), {args.concurrency} "
          f"closed-loop clients, max_tokens {args.max_tokens}; 2 workers ({MODEL}, 1 thread, {args.slots} slots, "
          f"KV {args.kv_budget_mib:g} MiB each)")
    print(f"{'place':<5} {'ok':>4} {'failed':>6} {'ttft50':>7} {'ttft95':>7} {'gen t/s':>8} {'all t/s':>8} "
          f"{'cached':>7} {'wall s':>7}")
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for placement in (False, True):
            results[placement].append(run_round(placement, args))
    print(f"mean prompt tokens per request: {results[True][0]['prompt_mean']:.0f}")

    def median(placement: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[placement])

    print(f"on/off: TTFT p50 x{median(True, 'ttft50') / median(False, 'ttft50'):.2f}, "
          f"p95 x{median(True, 'ttft95') / median(False, 'ttft95'):.2f}, "
          f"throughput x{median(True, 'all_tps') / median(False, 'all_tps'):.2f} "
          f"(generated x{median(True, 'gen_tps') / median(False, 'gen_tps'):.2f})")


if __name__ == "__main__":
    main()
