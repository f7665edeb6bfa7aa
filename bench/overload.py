"""Overload benchmark: a burst of concurrent streams against 2 workers; does every client hear from the server at once?

Fires --streams streaming chat completions (max_tokens --max-tokens) all at once at a gateway with two SmolLM2
workers, twice in one run: with the queued-stream notice off (LLMFLEET_SSE_QUEUED_AFTER_S=600: a queued stream
sends nothing until its first token, as before) as the baseline, then with the defaults (`: queued` after 0.25 s,
then keep-alives). Per round it prints how many responses got their first byte after more than 2 s and how many had
any gap of more than 2 s without a byte, the time to the first byte and to the first token, deadline failures among admitted requests, and refusals (429 with Retry-After).
A third round makes admission refuse: the request deadline is short (--deadline, LLMFLEET_REQUEST_TIMEOUT_S), so the
gateway's estimated wait (gateway/cluster/admission.py) passes half of it; the burst is fired twice on the same cluster,
on fresh workers (no finish rate measured yet) and again once they have measured one. Per burst it prints the
admitted, the refusals (how many had Retry-After, its range, how long the 429 took), deadline failures among the
admitted (must be 0) and first bytes after more than 2 s (must be 0).
The clients write raw HTTP/1.1 on sockets and time from the moment the request is written: httpx's per-request
cost at 300 at once delayed the bench's own sends and reads by 2-4 s, which it reported as the server's latency.
Run: python bench/overload.py [--streams 300] [--max-tokens 16] [--rounds baseline,defaults,admission] [--deadline 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_processes import PY, Cluster  # noqa: E402

MODEL = "smollm2-135m"
SILENCE_S = 2.0


@dataclass
class Outcome:
    """What one client saw."""

    status: int
    first_byte_s: float | None  # for a refusal: when its headers came
    first_token_s: float | None
    longest_silence_s: float
    finished: bool
    error: str | None


async def one_stream(host: str, port: int, path: str, max_tokens: int) -> Outcome:
    """One streaming chat completion over a raw socket (a light client: with httpx the bench's own event loop
    took seconds to send 300 requests and read their replies, which showed as the server's latency); times every
    received piece from the moment the request is written."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Tell me about the sea."}],
                       "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    first_byte = first_token = None
    silence, error, finished, status = 0.0, None, False, 0
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return Outcome(0, None, None, 0.0, False, type(exc).__name__)
    try:
        writer.write(request)
        await writer.drain()
        started = last = time.monotonic()
        head = b""
        while True:
            piece = await reader.read(65536)
            now = time.monotonic()
            if not piece:
                break
            silence, last = max(silence, now - last), now
            first_byte = first_byte if first_byte is not None else now - started
            if not status:
                head += piece
                if b"\r\n\r\n" not in head:
                    continue
                header_text, _, piece = head.partition(b"\r\n\r\n")
                status = int(header_text.split(b" ", 2)[1])
                if status != 200:
                    retry = next((line.split(b":", 1)[1].strip().decode() for line in header_text.split(b"\r\n")
                                  if line.lower().startswith(b"retry-after:")), None)
                    return Outcome(status, first_byte, None, silence, False, retry)
            if first_token is None and b'"content":"' in piece and b'"content":""' not in piece:
                first_token = now - started
            if b'"error"' in piece:
                error = piece.decode(errors="replace")[:120]
            finished = finished or b"data: [DONE]" in piece
        return Outcome(status, first_byte, first_token, silence, finished and error is None, error)
    except OSError as exc:
        return Outcome(status, first_byte, first_token, silence, False, type(exc).__name__)
    finally:
        writer.close()


async def burst(base: str, streams: int, max_tokens: int) -> tuple[list[Outcome], float]:
    """All streams at once; their outcomes and the wall time."""
    url = urllib.parse.urlsplit(base + "/chat/completions")
    started = time.monotonic()
    outcomes = await asyncio.gather(*(one_stream(url.hostname or "127.0.0.1", url.port or 80, url.path, max_tokens)
                                      for _ in range(streams)))
    return list(outcomes), time.monotonic() - started


def run_round(label: str, env: dict[str, str], streams: int, max_tokens: int) -> None:
    """Start Redis, a gateway and two workers with `env`, fire the burst, print one line, stop them."""
    saved = dict(os.environ)
    os.environ.update(env)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="llmfleet-overload-")), queue_limit=256)
    try:
        _start_two_workers(cluster)
        outcomes, wall = asyncio.run(burst(cluster.url, streams, max_tokens))
    finally:
        cluster.close()
        os.environ.clear()
        os.environ.update(saved)
    admitted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    silent = sum(o.longest_silence_s > SILENCE_S for o in outcomes if o.status == 200)
    late = sum(o.first_byte_s is None or o.first_byte_s > SILENCE_S for o in admitted)
    bytes_at = sorted(o.first_byte_s for o in admitted if o.first_byte_s is not None)
    tokens_at = sorted(o.first_token_s for o in admitted if o.first_token_s is not None)
    failed = [o for o in admitted if not o.finished]
    other = len(outcomes) - len(admitted) - len(refused)

    def pct(values: list[float], q: float) -> str:
        return f"{values[min(len(values) - 1, int(q * len(values)))]:.1f}" if values else "-"

    print(f"{label:<28} {len(admitted):>8} {late:>11} {silent:>10} {pct(bytes_at, 0.5):>7} {pct(bytes_at, 0.99):>7} "
          f"{pct(tokens_at, 0.5):>8} {pct(tokens_at, 0.99):>8} {len(failed):>7} {len(refused):>8} {other:>6} "
          f"{wall:>7.1f}", flush=True)
    if failed:
        print(f"  first failure: {failed[0].error}", flush=True)
    if refused:
        print(f"  Retry-After of the refusals: {statistics.median(float(o.error or 0) for o in refused):.0f} s median")


def _start_two_workers(cluster: Cluster) -> None:
    """Redis and the gateway, then two one-thread workers of MODEL, ready."""
    cluster.start()
    workers = [cluster.spawn(f"worker{i}", [PY, "-m", "llmfleet.cli", "worker", "--model", MODEL, "--threads", "1"])
               for i in range(2)]
    for worker in workers:
        cluster.wait_model(MODEL, worker, 300)


def admission_round(streams: int, max_tokens: int, deadline_s: float) -> None:
    """A short request deadline so that admission must refuse: a burst on fresh workers, then one on warm ones."""
    saved = dict(os.environ)
    os.environ["LLMFLEET_REQUEST_TIMEOUT_S"] = str(deadline_s)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="llmfleet-overload-")), queue_limit=streams + 10)
    try:
        _start_two_workers(cluster)
        for label in ("cold (no rate measured yet)", "warm (rate measured)"):
            outcomes, wall = asyncio.run(burst(cluster.url, streams, max_tokens))
            print_admission(label, outcomes, wall)
            time.sleep(3)  # the last heartbeats of the burst are in before the next one
    finally:
        cluster.close()
        os.environ.clear()
        os.environ.update(saved)


def print_admission(label: str, outcomes: list[Outcome], wall: float) -> None:
    """One burst of the admission round: admitted, refused (Retry-After), deadline failures, late first bytes."""
    admitted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    retry = [float(o.error) for o in refused if o.error]
    deadline = sum(not o.finished and "deadline" in (o.error or "") for o in admitted)
    other_failures = sum(not o.finished for o in admitted) - deadline
    late = sum(o.first_byte_s is None or o.first_byte_s > SILENCE_S for o in admitted)
    silent = sum(o.longest_silence_s > SILENCE_S for o in admitted)
    refused_at = max((o.first_byte_s or 0.0 for o in refused), default=0.0)
    first_bytes = sorted(o.first_byte_s for o in admitted if o.first_byte_s is not None)
    byte_range = (f"{first_bytes[len(first_bytes) // 2]:.2f} / {first_bytes[int(0.99 * (len(first_bytes) - 1))]:.2f} s"
                  if first_bytes else "-")
    retry_range = f"{min(retry):.0f}-{max(retry):.0f} s" if retry else "-"
    print(f"  {label:<28} admitted {len(admitted):>3}  refused 429 {len(refused):>3} (Retry-After on {len(retry)}, "
          f"{retry_range}; slowest 429 after {refused_at:.2f} s)  deadline failures {deadline}  other failures "
          f"{other_failures}  first byte >2 s {late} (p50 / p99 {byte_range})  gap >2 s {silent}  other statuses "
          f"{len(outcomes) - len(admitted) - len(refused)}  wall {wall:.1f} s", flush=True)


def main() -> None:
    """The chosen rounds, one after the other."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", default="baseline,defaults,admission")
    parser.add_argument("--deadline", type=float, default=30.0, help="request deadline (s) of the admission round")
    args = parser.parse_args()
    rounds = args.rounds.split(",")
    print(f"{args.streams} concurrent streams, max_tokens {args.max_tokens}, 2 workers ({MODEL}, 1 thread each); "
          f"times in s from the request")
    print(f"{'round':<28} {'admitted':>8} {'1st byte>2s':>11} {'gap >2 s':>10} {'byte50':>7} {'byte99':>7} {'token50':>8} "
          f"{'token99':>8} {'failed':>7} {'429':>8} {'other':>6} {'wall':>7}")
    if "baseline" in rounds:
        run_round("baseline: no queued notice", {"LLMFLEET_SSE_QUEUED_AFTER_S": "600"}, args.streams, args.max_tokens)
    if "defaults" in rounds:
        run_round("defaults (: queued at 0.25 s)", {}, args.streams, args.max_tokens)
    if "admission" in rounds:
        print(f"admission round: request deadline {args.deadline:g} s (a request that must queue is admitted while its expected finish is under half)")
        admission_round(args.streams, args.max_tokens, args.deadline)


if __name__ == "__main__":
    main()
