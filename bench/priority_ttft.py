"""Priority under load: an interactive request's time to first token with a batch of N low-priority streams
running, against the same request on the idle worker, measured in the same run (issue 25: within 1.5x).

One SmolLM2 worker (LLMFLEET_SLOTS > N, so the batch is admitted whole), bundled Redis, one gateway. Per round:
interactive requests on the idle worker (idle TTFT), then N low-priority streams (ignore_eos, long) are started
and, once every one of them streams, the same interactive requests one after the other (loaded TTFT); the
batch is then closed (cancelled) and the worker drains it before the next round. The interactive requests are
normal priority, max_tokens 32, streamed; TTFT is until the first content byte at the client.

    python bench/priority_ttft.py [--batch 48] [--rounds 5] [--probes 3] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_processes import PY, Cluster  # noqa: E402

PROMPT = "Write a short note to a colleague about the meeting tomorrow."
BATCH_PROMPT = "Summarize the history of lighthouses along the northern coast, region by region."


async def ttft(client: httpx.AsyncClient, base: str, model: str) -> tuple[float, float]:
    """One interactive streamed completion: (seconds to its first content chunk, seconds to its end)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 32, "stream": True, "temperature": 0,
            "ignore_eos": True, "priority": "normal"}
    started, first = time.perf_counter(), None
    async with client.stream("POST", base + "/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if first is None and line.startswith("data: {") and '"text":""' not in line:
                first = time.perf_counter() - started
    return first if first is not None else float("nan"), time.perf_counter() - started


async def batch_stream(client: httpx.AsyncClient, base: str, model: str, started: list[int]) -> None:
    """One low-priority stream of the batch, read until it is cancelled."""
    body = {"model": model, "prompt": BATCH_PROMPT, "max_tokens": 4000, "stream": True, "temperature": 0.7,
            "ignore_eos": True, "priority": "low"}
    counted = False
    async with client.stream("POST", base + "/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not counted and line.startswith("data: {"):
                counted = True
                started[0] += 1


async def probes(client: httpx.AsyncClient, base: str, model: str, count: int) -> list[float]:
    """`count` interactive requests one after the other; their TTFTs."""
    return [(await ttft(client, base, model))[0] for _ in range(count)]


async def one_round(base: str, model: str, batch: int, count: int) -> tuple[list[float], list[float]]:
    """Idle TTFTs, then TTFTs with the batch running."""
    limits = httpx.Limits(max_connections=batch + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await ttft(client, base, model)  # warm the prefix cache the same way in both phases
        idle = await probes(client, base, model, count)
        started = [0]
        tasks = [asyncio.create_task(batch_stream(client, base, model, started)) for _ in range(batch)]
        deadline = time.monotonic() + 300
        while started[0] < batch:
            if time.monotonic() > deadline or any(t.done() for t in tasks):
                raise RuntimeError(f"only {started[0]} of {batch} batch streams started")
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # every batch stream decoding
        loaded = await probes(client, base, model, count)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return idle, loaded


def main() -> None:
    """Start the cluster, run the rounds, print per-round medians and the ratio's range."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--threads", default=os.environ.get("LLMFLEET_THREADS", "2"))
    args = parser.parse_args()
    os.environ.update(LLMFLEET_SLOTS=str(args.batch + 8), LLMFLEET_THREADS=args.threads)
    logdir = Path(tempfile.mkdtemp(prefix="llmfleet-priority-"))
    cluster = Cluster(logdir, queue_limit=args.batch * 4).start()
    try:
        worker = cluster.spawn("worker", [PY, "-m", "llmfleet.cli", "worker", "--model", args.model])
        cluster.wait_model(args.model, worker, 300)
        ratios = []
        print(f"{args.batch} low-priority streams, {args.probes} interactive probes per phase (logs: {logdir})")
        for index in range(args.rounds):
            idle, loaded = asyncio.run(one_round(cluster.url, args.model, args.batch, args.probes))
            ratio = statistics.median(loaded) / statistics.median(idle)
            ratios.append(ratio)
            print(f"round {index + 1}: idle TTFT {[round(t * 1000) for t in idle]} ms, with the batch "
                  f"{[round(t * 1000) for t in loaded]} ms: {ratio:.2f}x", flush=True)
            time.sleep(2.0)  # the cancelled batch leaves the worker
        print(f"loaded/idle TTFT (medians per round): {min(ratios):.2f}x..{max(ratios):.2f}x, "
              f"median {statistics.median(ratios):.2f}x (target <= 1.5x)")
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
