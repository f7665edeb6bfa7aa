"""Decode speed against the worker's round trip to Redis: per-stream and 32-stream aggregate tok/s at 0, 0.2,
1 and 5 ms RTT, in one run, as ratios to 0 ms (issue 25: aim >= 0.9x at 1 ms, >= 0.8x at 5 ms).

Run: python bench/redis_latency.py [--model smollm2-135m] [--rtts 0,0.2,1,5] [--streams 32] [--tree DIR]

A bundled Redis; one real worker process (`llmfleet worker`, from --tree: default this checkout, e.g.
/work/main to measure another revision) that reaches Redis only through bench/delay_proxy.py, which adds
half the RTT each way (Redis on another host). The measuring client reads the events straight from Redis (the
gateway's side is not delayed). Network namespaces with `tc netem` would be the kernel's way to add the delay;
the bench says whether this machine has netem and uses the proxy either way (the same path at 0 ms too).

Per stream: one request alone, tokens after the first over the time from the first to the last. Aggregate:
`--streams` requests at once, tokens received while all of them were decoding (from the last stream's first
token to the first stream's last) over that window. Best of --repeat rounds, the RTTs interleaved. Greedy, ignore_eos, distinct prompts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from cluster_processes import die_with_parent, wait_until  # noqa: E402
from delay_proxy import DelayProxy, measured_rtt_ms  # noqa: E402

from llmfleet.redis_server import BundledRedis  # noqa: E402
from shared import codec, keys  # noqa: E402
from shared.messages import DoneEvent, ErrorEvent, GenerateJob, Sampling, TokenEvent  # noqa: E402

PY = sys.executable


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
    pubsub.subscribe(*(keys.events_channel(rid) for rid in ids))
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
    args = parser.parse_args()
    rtts = [float(r) for r in args.rtts.split(",")]
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
        vocab = 49152
        run_requests(client, model, 2, 8, vocab)  # warm up
        best: dict[float, list[float]] = {rtt: [0.0, 0.0, 0.0] for rtt in rtts}  # PING ms, 1 stream, aggregate
        for round_no in range(args.repeat):  # the RTTs interleaved, so load that changes hits them alike
            for rtt in rtts:
                proxy.set_rtt(rtt / 1000)
                time.sleep(0.3)
                measured = measured_rtt_ms(f"redis://127.0.0.1:{proxy.port}/0")
                single = per_stream_rate(run_requests(client, model, 1, args.max_tokens, vocab)[0])
                many = aggregate_rate(run_requests(client, model, args.streams, args.max_tokens, vocab))
                row = best[rtt]
                row[0], row[1], row[2] = measured, max(row[1], single), max(row[2], many)
                print(f"  round {round_no + 1} rtt {rtt:4.1f} ms (PING {measured:5.2f} ms): 1 stream {single:6.1f} "
                      f"tok/s, {args.streams} streams {many:7.1f} tok/s", flush=True)
        rows = [(rtt, *best[rtt]) for rtt in rtts]
        base_single, base_many = rows[0][2], rows[0][3]
        print(f"\n| RTT added | PING via proxy | 1 stream tok/s | ratio | {args.streams} streams tok/s | ratio |")
        print("|---|---|---|---|---|---|")
        for rtt, measured, single, many in rows:
            print(f"| {rtt:g} ms | {measured:.2f} ms | {single:.1f} | {single / base_single:.2f}x | {many:.1f} | "
                  f"{many / base_many:.2f}x |")
        print(f"(load average {os.getloadavg()[0]:.2f} at the end)")
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        proxy.close()
        server.stop()


if __name__ == "__main__":
    main()
