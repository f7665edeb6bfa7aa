"""Decode speed against the worker's round trip to Redis: per-stream and 32-stream aggregate tok/s at 0, 0.2,
1 and 5 ms RTT, in one run, as ratios to 0 ms (issue 25: aim >= 0.9x at 1 ms, >= 0.8x at 5 ms).

Run: python bench/redis_latency.py [--model smollm2-135m] [--rtts 0,0.2,1,5] [--streams 32] [--tree DIR]

A bundled Redis; one real worker process (`llmfleet worker`, from --tree: default this checkout, e.g.
/work/main to measure another revision) that reaches Redis only through bench/delay_proxy.py, which adds
half the RTT each way (Redis on another host). The measuring client reads the events straight from Redis (the
gateway's side is not delayed). Network namespaces with `tc netem` would be the kernel's way to add the delay;
the bench says whether this machine has netem and uses the proxy either way (the same path at 0 ms too).

--netns: the same measurement in the namespace test bed (tests/support/netns.py): Redis, a gateway and the
worker each in a network namespace of its own on a bridge, the delay proxy inside the worker's namespace (so
only the worker is "far" from Redis), and the client in the root namespace streaming from the gateway over
HTTP (/v1/completions, token-id prompts): the path a user's tokens take. Tokens are counted per SSE frame (one
token event each). Needs root and iproute2.

Per stream: one request alone, tokens after the first over the time from the first to the last. Aggregate:
`--streams` requests at once, tokens received while all of them were decoding (from the last stream's first
token to the first stream's last) over that window. Best of --repeat rounds, the RTTs interleaved. Greedy, ignore_eos, distinct prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from cluster_processes import die_with_parent, wait_until  # noqa: E402
from delay_proxy import DelayProxy, measured_rtt_ms  # noqa: E402

from llmfleet.redis_server import BundledRedis  # noqa: E402
from shared import codec, keys  # noqa: E402
from shared.messages import DoneEvent, ErrorEvent, GenerateJob, Sampling, TokenEvent  # noqa: E402

PY = sys.executable
VOCAB = 49152  # SmolLM2's; prompts are token ids below it


def netem_available() -> str:
    """Whether `tc netem` works here (tried on the loopback of a scratch network namespace)."""
    name = f"llmfleet-probe-{os.getpid()}"
    try:
        if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
            return "no (cannot create a network namespace)"
        probe = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                "delay", "1ms"], capture_output=True, text=True)
        return "yes" if probe.returncode == 0 else f"no ({probe.stderr.strip() or 'tc failed'})"
    except FileNotFoundError:
        return "no (iproute2 is not installed)"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def run_requests(client: redis.Redis, model: str, count: int, max_tokens: int, vocab: int) -> list[list[float]]:
    """Send `count` requests at once; the arrival times of each one's tokens."""
    ids = [f"lat-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    pubsub = client.pubsub()
    pubsub.subscribe(*(keys.events_channel(model, rid) for rid in ids))
    for _ in ids:
        pubsub.get_message(timeout=5)
    now = time.time()
    for n, rid in enumerate(ids):
        prompt = [(7919 * (n + 1) * (i + 3) + int(now)) % (vocab - 10) + 5 for i in range(24)]
        job = GenerateJob(id=rid, model=model, created=now, deadline=now + 300, prompt_token_ids=prompt,
                          max_tokens=max_tokens, ignore_eos=True, sampling=Sampling(temperature=0.0))
        client.xadd(keys.jobs_stream(model), {keys.JOB_FIELD: codec.encode_job(job)})
    arrivals: dict[str, list[float]] = {rid: [] for rid in ids}
    open_ids = set(ids)
    deadline = time.monotonic() + 300
    while open_ids and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=1.0)
        if not message or message["type"] != "message":
            continue
        event = codec.decode_event(message["data"])
        if isinstance(event, TokenEvent):
            arrivals[event.id] += [time.monotonic()] * max(1, len(event.token_ids))
        elif isinstance(event, DoneEvent | ErrorEvent):
            open_ids.discard(event.id)
    pubsub.close()
    if open_ids:
        raise RuntimeError(f"{len(open_ids)} requests did not end")
    return list(arrivals.values())


async def _gateway_stream(client: Any, base: str, model: str, prompt: list[int], max_tokens: int) -> list[float]:
    """One streamed completion through the gateway; the arrival time of each token frame."""
    body = {"model": model, "prompt": [prompt], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    arrivals: list[float] = []
    buffer = b""
    async with client.stream("POST", base + "/v1/completions", json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}")
        async for raw in reply.aiter_raw():
            buffer += raw
            *frames, buffer = buffer.split(b"\n\n")
            for frame in frames:
                at = frame.find(b"data: {")  # after any `: keep-alive` and `id:` lines
                if at >= 0:
                    chunk = json.loads(frame[at + 6:])
                    if "error" in chunk:
                        raise RuntimeError(f"in-stream error: {chunk['error']}")
                    if any(c.get("finish_reason") is None for c in chunk.get("choices", [])):
                        arrivals.append(time.monotonic())
    return arrivals


def run_gateway_requests(base: str, key: str, model: str, count: int, max_tokens: int, vocab: int
                         ) -> list[list[float]]:
    """Send `count` streamed requests at once through the gateway; the arrival times of each one's tokens."""
    import httpx

    async def run() -> list[list[float]]:
        limits = httpx.Limits(max_connections=count + 4)
        now = int(time.time())
        async with httpx.AsyncClient(timeout=300, limits=limits, headers={"Authorization": f"Bearer {key}"}) as c:
            return list(await asyncio.gather(*(
                _gateway_stream(c, base, model, [(7919 * (n + 1) * (i + 3) + now) % (vocab - 10) + 5
                                                 for i in range(24)], max_tokens) for n in range(count))))

    return asyncio.run(run())


def per_stream_rate(arrivals: list[float]) -> float:
    """Tokens after the first over the time from the first to the last."""
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def aggregate_rate(streams: list[list[float]]) -> float:
    """Tokens received while every stream was decoding, over that window."""
    start = max(s[0] for s in streams)
    end = min(s[-1] for s in streams)
    if end <= start:
        return float("nan")
    return sum(1 for s in streams for t in s if start < t <= end) / (end - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rtts", default="0,0.2,1,5", help="round trips to add, ms")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout whose worker runs (its packages come first)")
    parser.add_argument("--netns", action="store_true", help="Redis, gateway and worker in namespaces of their own")
    args = parser.parse_args()
    rtts = [float(r) for r in args.rtts.split(",")]
    if args.netns:
        measure_in_netns(args, rtts)
        return
    print(f"netem: {netem_available()}; delay by bench/delay_proxy.py; worker from {args.tree}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    server = BundledRedis().start()
    proxy = DelayProxy("127.0.0.1", server.port).start()
    logdir = Path(tempfile.mkdtemp(prefix="redis-latency-"))
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0", "PYTHONPATH": args.tree,
           "PYTHONDONTWRITEBYTECODE": "1"}  # another checkout is only read
    with open(logdir / "worker.log", "wb") as log:
        worker = subprocess.Popen([PY, "-m", "llmfleet.cli", "worker", "--model", args.model, "--slots",
                                   str(args.streams)], env=env, cwd=args.tree, stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=die_with_parent)
    client = redis.Redis.from_url(server.url)
    try:
        wait_until(lambda: any(client.scan_iter(match=keys.worker_key("*"))), 300, "the worker to register")
        model = client.hget(next(client.scan_iter(match=keys.worker_key("*"))), "model").decode()
        vocab = VOCAB
        run_requests(client, model, 2, 8, vocab)  # warm up
        best: dict[float, list[float]] = {rtt: [0.0, 0.0, 0.0] for rtt in rtts}  # PING ms, 1 stream, aggregate
        for round_no in range(args.repeat):  # the RTTs interleaved, so load that changes hits them alike
            for rtt in rtts:
                proxy.set_rtt(rtt / 1000)
                time.sleep(0.3)
                measured = measured_rtt_ms(f"redis://127.0.0.1:{proxy.port}/0")
                single = per_stream_rate(run_requests(client, model, 1, args.max_tokens, vocab)[0])
                many = aggregate_rate(run_requests(client, model, args.streams, args.max_tokens, vocab))
                record_round(best[rtt], round_no, rtt, measured, single, many, args.streams)
        print_table(best, rtts, args.streams)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        proxy.close()
        server.stop()


def record_round(row: list[float], round_no: int, rtt: float, measured: float, single: float, many: float,
                 streams: int) -> None:
    """Keep a round's best rates in `row` ([PING ms, 1-stream tok/s, N-stream tok/s]) and print the round."""
    row[0], row[1], row[2] = measured, max(row[1], single), max(row[2], many)
    print(f"  round {round_no + 1} rtt {rtt:4.1f} ms (PING {measured:5.2f} ms): 1 stream {single:6.1f} "
          f"tok/s, {streams} streams {many:7.1f} tok/s", flush=True)


def print_table(best: dict[float, list[float]], rtts: list[float], streams: int) -> None:
    """The best rates per RTT as a markdown table, with their ratios to the first RTT (0 ms)."""
    rows = [(rtt, *best[rtt]) for rtt in rtts]
    base_single, base_many = rows[0][2], rows[0][3]
    print(f"\n| RTT added | PING via proxy | 1 stream tok/s | ratio | {streams} streams tok/s | ratio |")
    print("|---|---|---|---|---|---|")
    for rtt, measured, single, many in rows:
        print(f"| {rtt:g} ms | {measured:.2f} ms | {single:.1f} | {single / base_single:.2f}x | {many:.1f} | "
              f"{many / base_many:.2f}x |")
    print(f"(load average {os.getloadavg()[0]:.2f} at the end)")


def measure_in_netns(args: argparse.Namespace, rtts: list[float]) -> None:
    """The measurement in the namespace test bed: Redis, gateway and worker on hosts of their own."""
    from tests.support.netns import GATEWAY_PORT, NetnsBed, unavailable

    reason = unavailable()
    if reason is not None:
        sys.exit(f"no namespace test bed: {reason}")
    print(f"namespace bed; delay by bench/delay_proxy.py inside the worker's namespace; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    logdir, key = Path(tempfile.mkdtemp(prefix="redis-latency-netns-")), "bench-netns-key"
    bed = NetnsBed()
    try:
        for host in ("redis", "gw0", "w0"):
            bed.add_host(host)
        redis_url = bed.start_redis("redis", logdir / "redis.log")
        env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": args.tree, "PYTHONDONTWRITEBYTECODE": "1"}
        bed.popen("gw0", [PY, "-m", "llmfleet.cli", "gateway"], {**env, "LLMFLEET_HOST": "0.0.0.0", "LLMFLEET_PORT":
                  str(GATEWAY_PORT), "LLMFLEET_API_KEY": key}, logdir / "gw0.log")
        worker_url = bed.delayed_url("w0", redis_url, 0.0, logdir / "proxy.log")
        bed.popen("w0", [PY, "-m", "llmfleet.cli", "worker", "--model", args.model, "--slots", str(args.streams)],
                  {**env, "REDIS_URL": worker_url}, logdir / "w0.log")
        base = f"http://{bed.hosts['gw0'].address}:{GATEWAY_PORT}"
        wait_until(lambda: _ready_workers(base) >= 1, 300, "the worker to register with the gateway")
        run_gateway_requests(base, key, args.model, 2, 8, VOCAB)  # warm up
        best: dict[float, list[float]] = {rtt: [0.0, 0.0, 0.0] for rtt in rtts}  # PING ms, 1 stream, aggregate
        for round_no in range(args.repeat):  # the RTTs interleaved, so load that changes hits them alike
            for rtt in rtts:
                bed.set_delay("w0", rtt / 1000)
                time.sleep(0.3)
                measured = float(bed.run_in("w0", [PY, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from "
                                                   "delay_proxy import measured_rtt_ms; print(measured_rtt_ms(sys"
                                                   ".argv[2]))", str(Path(__file__).parent), worker_url]).stdout)
                single = per_stream_rate(run_gateway_requests(base, key, args.model, 1, args.max_tokens, VOCAB)[0])
                many = aggregate_rate(run_gateway_requests(base, key, args.model, args.streams, args.max_tokens,
                                                           VOCAB))
                record_round(best[rtt], round_no, rtt, measured, single, many, args.streams)
        print_table(best, rtts, args.streams)
    finally:
        bed.close()
        print(f"(logs in {logdir})")


def _ready_workers(base: str) -> int:
    import httpx

    try:
        return int(httpx.get(base + "/ready", timeout=2).json().get("workers", 0))
    except (httpx.HTTPError, ValueError):
        return 0


if __name__ == "__main__":
    main()
