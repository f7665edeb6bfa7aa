"""Fair shares within a priority class (issue 42): tenant A sends a burst of N requests at once, tenant B one request
a second meanwhile, same class. Prints B's median TTFT against its idle TTFT (target: within 2x) and A's token
throughput against A's burst alone (target: within 10%), with fair shares on and, for contrast, off (first in,
first out), each on a fresh one-worker cluster (bundled Redis, one gateway, SmolLM2 by default). A's burst comes
from a client process of its own, B's probes from this one.

    python bench/fair_shares.py [--burst 60] [--tokens 32] [--slots 8] [--model smollm2-135m] [--rounds 1] [--skip-fifo]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llmfleet.local_cluster import LocalCluster  # noqa: E402


async def request(client: httpx.AsyncClient, model: str, tenant: str, tokens: int,
                  timings: list[dict] | None = None) -> float:
    """One streamed completion for `tenant`: seconds to its first content chunk (it is read to its end); the worker's
    own account (the last chunk's llama-server `timings`: queue_ms, the wait for a slot from the gateway's taking the
    request, and prompt_ms, admission to the first token) goes to `timings`."""
    body = {"model": model, "prompt": f"A note from {tenant}:", "max_tokens": tokens, "stream": True,
            "ignore_eos": True, "temperature": 0, "timings_per_token": timings is not None}
    started, first, last = time.perf_counter(), None, ""
    async with client.stream("POST", "/v1/completions", json=body, headers={"X-LLMFleet-Tenant": tenant}) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{tenant}: {reply.status_code} {(await reply.aread()).decode()[:300]}")
        async for line in reply.aiter_lines():
            if first is None and line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                first = time.perf_counter() - started
            if line.startswith("data: {"):
                last = line
    if timings is not None and '"timings"' in last:
        timings.append(json.loads(last[len("data: "):])["timings"])
    return first if first is not None else time.perf_counter() - started


async def burst(client: httpx.AsyncClient, model: str, n: int, tokens: int) -> float:
    """A's n requests at once: tokens per second over the whole burst."""
    started = time.perf_counter()
    await asyncio.gather(*(request(client, model, "A", tokens) for _ in range(n)))
    return n * tokens / (time.perf_counter() - started)


def tenant_a(base: str, model: str, n: int, tokens: int) -> float:
    """A's burst from a client process of its own (two tenants are two clients: one event loop reading A's n
    streams would delay B's first chunk by its own work): A's tokens per second."""
    async def main() -> float:
        async with httpx.AsyncClient(base_url=base, timeout=600, limits=httpx.Limits(max_connections=n + 8)) as client:
            return await burst(client, model, n, tokens)
    return asyncio.run(main())


async def scenario(base: str, model: str, n: int, tokens: int, rounds: int) -> dict[str, float]:
    """Idle TTFT of B, then A's burst alone and with B probing once a second, alternately (`rounds` of each, and a
    last one alone: each round with B is set against the mean of the runs alone beside it)."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return await probed(base, model, n, tokens, rounds, pool)


async def probed(base: str, model: str, n: int, tokens: int, rounds: int,
                 pool: concurrent.futures.Executor) -> dict[str, float]:
    """`scenario` with A's client process in `pool`."""
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await request(client, model, "warm", 4)  # this client's own first request
        idles = [await request(client, model, "B", tokens) for _ in range(3)]
        print("idle B TTFTs (s):", " ".join(f"{t:.3f}" for t in idles), flush=True)
        alone = [await loop.run_in_executor(pool, tenant_a, base, model, n, tokens)]
        shared, probes = [], []
        for _ in range(rounds):
            tps, ttfts = await with_probes(client, loop.run_in_executor(pool, tenant_a, base, model, n, tokens),
                                           model, tokens)
            shared.append(tps)
            probes.extend(ttfts)
            alone.append(await loop.run_in_executor(pool, tenant_a, base, model, n, tokens))
        stopped = _interrupted_steps((await client.get("/metrics")).text)
    ratios = [tps * 2 / (alone[i] + alone[i + 1]) for i, tps in enumerate(shared)]
    print("A alone (tok/s):", " ".join(f"{t:.0f}" for t in alone), "| with B:", " ".join(f"{t:.0f}" for t in shared),
          "| ratios:", " ".join(f"{r:.2f}" for r in ratios), f"| steps stopped for B's: {stopped:.0f}", flush=True)
    return {"idle_ttft": statistics.median(idles), "loaded_ttft": statistics.median(probes) if probes else float("nan"),
            "probes": len(probes), "alone_tps": statistics.mean(alone), "shared_tps": statistics.mean(shared),
            "ratio": statistics.median(ratios)}


async def with_probes(client: httpx.AsyncClient, a: asyncio.Future, model: str, tokens: int) -> tuple[float, list]:
    """A's burst (running as `a`) with B's request one a second whether or not the last has ended (the issue's
    "one request a second"): A's tokens per second and B's TTFTs."""
    started = time.perf_counter()
    probes, sent, accounts = [], [], []
    while not a.done():
        await asyncio.sleep(1.0)
        if not a.done():
            sent.append(time.perf_counter() - started)
            probes.append(asyncio.create_task(request(client, model, "B", tokens, timings := [])))
            accounts.append(timings)
    shared = await a
    lasted = time.perf_counter() - started
    ttfts = list(await asyncio.gather(*probes))
    print(f"B TTFTs under A's burst of {lasted:.1f} s (s, at s from its start):",
          " ".join(f"{t:.3f}@{at:.0f}" for t, at in zip(ttfts, sent)), flush=True)
    slow = [(t, at, account[0]) for t, at, account in zip(ttfts, sent, accounts) if t > 0.1 and account]
    if slow:
        print("  the slow ones, the worker's account (queue ms / prompt ms):",
              " ".join(f"{t:.3f}@{at:.0f}: {a['queue_ms']:.0f}/{a['prompt_ms']:.0f}" for t, at, a in slow), flush=True)
    return shared, ttfts


def _interrupted_steps(metrics: str) -> float:
    """llmfleet_worker_interrupted_steps_total summed over the cluster's workers."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("llmfleet_worker_interrupted_steps_total"))


def run(model: str, n: int, tokens: int, slots: int, fair: bool, rounds: int) -> dict[str, float]:
    """One scenario on a fresh cluster with fair shares on or off."""
    with tempfile.TemporaryDirectory() as logdir:
        cluster = LocalCluster(Path(logdir), {"LLMFLEET_LOG_LEVEL": "WARNING", "LLMFLEET_SLOTS": str(slots),
                                              "LLMFLEET_QUEUE_LIMIT": str(n * 2), "LLMFLEET_REQUEST_TIMEOUT_S": "86400",
                                              "LLMFLEET_FAIR_SHARES": "1" if fair else "0"}, model=model)
        try:
            cluster.start(1)
            return asyncio.run(scenario(cluster.base_url, model, n, tokens, rounds))
        finally:
            cluster.close()


def main() -> None:
    """Print B's TTFT ratio and A's throughput ratio, fair shares on and off."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--burst", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=0, help="the worker's slots (0: auto, 64 for SmolLM2 here)")
    parser.add_argument("--rounds", type=int, default=1, help="A's burst with B this many times, each between two "
                        "bursts alone")
    parser.add_argument("--skip-fifo", action="store_true")
    args = parser.parse_args()
    for fair in (True,) if args.skip_fifo else (True, False):
        r = run(args.model, args.burst, args.tokens, args.slots, fair, args.rounds)
        print(f"fair shares {'on ' if fair else 'off'}: B TTFT idle {r['idle_ttft'] * 1000:.0f} ms, under A's burst "
              f"{r['loaded_ttft'] * 1000:.0f} ms (median of {r['probes']}, {r['loaded_ttft'] / r['idle_ttft']:.2f}x); "
              f"A {r['alone_tps']:.0f} tok/s alone, {r['shared_tps']:.0f} with B "
              f"(median ratio {r['ratio']:.2f}x)")


if __name__ == "__main__":
    main()
