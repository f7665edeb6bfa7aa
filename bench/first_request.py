"""The first request after a worker registers against the tenth (issue 42: within 1.5x), on a fresh cluster.

Starts the bundled Redis, a gateway and one worker (a new process each run), then sends ten streamed chat
requests one after the other (max_tokens 8, temperature 0.7, a stop string) and prints each one's time to first
token and total time, and the first's ratio to the tenth's. The client's own first request (imports, its
connection) is made before the timed ones, on /health: a client's cold start is not the server's.

    python bench/first_request.py [--model smollm2-135m] [--requests 10] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llmfleet.local_cluster import LocalCluster  # noqa: E402


def timed_request(client: httpx.Client, base: str, model: str, index: int) -> tuple[float, float]:
    """One streamed chat request: (seconds to its first content chunk, seconds to its end)."""
    body = {"model": model, "max_tokens": 8, "stream": True, "temperature": 0.7, "stop": ["\n\n"],
            "messages": [{"role": "user", "content": f"Say something about the number {index}."}]}
    started, first = time.perf_counter(), None
    with client.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if first is None and line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"] if '"choices"' in line else {}
                if delta.get("content"):
                    first = time.perf_counter() - started
    total = time.perf_counter() - started
    return (first if first is not None else total), total


def one_run(model: str, requests: int) -> list[tuple[float, float]]:
    """`requests` requests on a fresh one-worker cluster: their (TTFT, total) in order."""
    with tempfile.TemporaryDirectory() as logdir:
        cluster = LocalCluster(Path(logdir), {"LLMFLEET_LOG_LEVEL": "WARNING", "LLMFLEET_THREADS": "1"}, model=model)
        try:
            cluster.start(1)
            with httpx.Client() as client:  # this process's own first request costs ~80 ms: not the server's
                client.get(cluster.base_url + "/health").raise_for_status()
                return [timed_request(client, cluster.base_url, model, i) for i in range(requests)]
        finally:
            cluster.close()


def main() -> None:
    """Print every request's TTFT and total, and first / tenth."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for run in range(args.runs):
        times = one_run(args.model, args.requests)
        print(f"run {run}: " + " ".join(f"{ttft * 1000:.0f}/{total * 1000:.0f}ms" for ttft, total in times))
        print(f"  first TTFT {times[0][0] * 1000:.0f} ms, last {times[-1][0] * 1000:.0f} ms: "
              f"{times[0][0] / times[-1][0]:.2f}x; totals {times[0][1] / times[-1][1]:.2f}x")


if __name__ == "__main__":
    main()
