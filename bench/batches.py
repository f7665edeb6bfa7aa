"""Batch benchmark: N requests as one /v1/batches batch against the same N sent directly at once, and what a
running batch does to the latency of an interactive request (its lines run at priority low).

It starts a bundled Redis, one gateway, one SmolLM2 worker (--slots) and one `llmfleet batch-runner`
(--concurrency), all stopped at the end. Every request is a greedy /v1/completions with ignore_eos and
--max-tokens, distinct short prompts.
1. direct: N requests at once with the async openai client; wall time.
2. batch: the same N as one batch; wall time from batches.create to status completed (polled every 0.1 s);
   the outputs are checked equal to part 1's.
3. interactive: one streamed request's first-token time and latency with the worker idle, then while a second
   batch of N runs (its lines at priority low: the interactive request preempts them, worker/schedule/preemption.py).
Run: python bench/batches.py [--requests 32] [--max-tokens 32] [--slots 16] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))

import openai  # noqa: E402
from cluster_processes import PY, Cluster, wait_until  # noqa: E402

MODEL = "smollm2-135m"


def bodies(n: int, max_tokens: int, tag: str) -> list[dict]:
    """N distinct greedy completion bodies."""
    return [{"model": MODEL, "prompt": f"{tag} note {i}: the history of", "max_tokens": max_tokens, "temperature": 0,
             "ignore_eos": True} for i in range(n)]


async def direct(client: openai.AsyncOpenAI, requests: list[dict]) -> tuple[float, list[str]]:
    """Send every request at once; (wall seconds, texts)."""
    started = time.perf_counter()
    replies = await asyncio.gather(*(client.completions.create(**{k: v for k, v in body.items() if k != "ignore_eos"},
                                                               extra_body={"ignore_eos": True}) for body in requests))
    return time.perf_counter() - started, [r.choices[0].text for r in replies]


async def run_batch(client: openai.AsyncOpenAI, requests: list[dict]) -> tuple[float, list[str]]:
    """One batch of the requests; (wall seconds from create to completed, texts in input order)."""
    data = "".join(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/completions", "body": body}) + "\n"
                   for i, body in enumerate(requests)).encode()
    upload = await client.files.create(file=("bench.jsonl", data), purpose="batch")
    started = time.perf_counter()
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        await asyncio.sleep(0.1)
        batch = await client.batches.retrieve(batch.id)
    elapsed = time.perf_counter() - started
    assert batch.status == "completed" and batch.request_counts.failed == 0, batch
    lines = [json.loads(line) for line in (await client.files.content(batch.output_file_id)).text.splitlines()]
    return elapsed, [line["response"]["body"]["choices"][0]["text"] for line in lines]


async def one(client: openai.AsyncOpenAI, max_tokens: int) -> tuple[float, float]:
    """One interactive (normal priority) streamed request: (seconds to its first token, seconds to its end)."""
    started = time.perf_counter()
    first = None
    stream = await client.completions.create(model=MODEL, prompt="An interactive question:", max_tokens=max_tokens,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - started
    return first or float("nan"), time.perf_counter() - started


async def measure(url: str, args: argparse.Namespace) -> None:
    """Parts 1 to 3, printed as a table."""
    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    await direct(client, bodies(2, 4, "warm-up"))
    requests = bodies(args.requests, args.max_tokens, "bench")
    direct_s, direct_texts = await direct(client, requests)
    batch_s, batch_texts = await run_batch(client, requests)
    assert batch_texts == direct_texts, "a batch output differs from the direct request's"
    idle = min([await one(client, args.max_tokens) for _ in range(3)])  # (first token, end) of the quickest
    second = asyncio.create_task(run_batch(client, bodies(args.requests, args.max_tokens, "background")))
    await asyncio.sleep(2.0)  # the batch is running
    busy = [await one(client, args.max_tokens) for _ in range(3)]
    await second
    tokens = args.requests * args.max_tokens
    print(f"{args.requests} requests x {args.max_tokens} tokens, worker slots {args.slots}, "
          f"batch concurrency {args.concurrency}")
    print(f"{'':28}{'wall s':>8}{'req/s':>8}{'tok/s':>8}")
    print(f"{'direct (all at once)':28}{direct_s:8.2f}{args.requests / direct_s:8.2f}{tokens / direct_s:8.1f}")
    print(f"{'batch (create -> completed)':28}{batch_s:8.2f}{args.requests / batch_s:8.2f}{tokens / batch_s:8.1f}")
    print(f"batch / direct wall time: {batch_s / direct_s:.2f}; outputs identical: yes")
    print(f"interactive request latency: idle {idle[1]:.2f}s, while a batch runs "
          f"{', '.join(f'{b[1]:.2f}' for b in busy)}s")
    print(f"interactive first token: idle {idle[0]:.3f}s, while a batch runs "
          f"{', '.join(f'{b[0]:.3f}' for b in busy)}s (ratio to idle {', '.join(f'{b[0] / idle[0]:.2f}' for b in busy)})")


def main() -> None:
    """Start the cluster, measure, stop everything."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmfleet-bench-batches-") as logdir:
        cluster = Cluster(Path(logdir), queue_limit=4 * args.requests).start()
        try:
            worker = cluster.spawn("worker", [PY, "-m", "llmfleet.cli", "worker", "--model", MODEL,
                                              "--slots", str(args.slots)])
            cluster.wait_model(MODEL, worker, 240)
            os.environ["LLMFLEET_BATCH_CONCURRENCY"] = str(args.concurrency)
            runner = cluster.spawn("batch-runner", [PY, "-m", "llmfleet.cli", "batch-runner"])
            wait_until(lambda: runner.poll() is None, 5, "the batch runner")
            asyncio.run(measure(cluster.url, args))
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
