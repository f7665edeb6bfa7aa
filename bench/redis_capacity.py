"""Redis capacity: commands, bytes and Redis CPU per generated token and per request, and what one Redis carries.

One bundled Redis, one gateway and bench/standin_worker.py (a stand-in engine that registers, takes jobs and
journals + publishes one token per held job per tick in ONE MULTI/EXEC, as a real worker's publisher does).
Redis's own counters are read around each phase: INFO commandstats (calls per command), INFO stats
(total_net_input_bytes / total_net_output_bytes) and INFO cpu (used_cpu_sys + used_cpu_user of the server).

1. idle: the gateway and one idle stand-in for --idle-s (the background: heartbeats, blocking reads);
   then --idle-workers more idle stand-ins: the cost of one more idle worker.
2. load: for each --streams level, N streams of --short then --long tokens through the gateway
   (bench/relay_client.py); the background rate is subtracted, and the two lengths split the cost into a
   per-request part and a per-token part (cost = requests x per_request + tokens x per_token).
3. --real MODEL: the same counters around streams on a real worker (fenced publish script per request
   per step), for comparison with the stand-in's plain MULTI/EXEC.
The ceiling printed is Redis's single core divided by its CPU per token: tokens/s, and streams at --rate.
Run: python bench/redis_capacity.py [--streams 50,200] [--short 16] [--long 128] [--rate 20] [--real smollm2-135m]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))  # this tree's packages first (what its gateway and stand-ins run)

from cluster_processes import PY, Cluster  # noqa: E402
from relay_client import run_relay  # noqa: E402
from stream_load import run_level  # noqa: E402

from shared import keys  # noqa: E402
from worker.models import model_id  # noqa: E402

STANDIN_MODEL = "standin"
IDLE_MODEL = "standin-idle"
API_KEY = os.environ.get("LLMFLEET_API_KEY", "none")


@dataclass
class Counters:
    """Redis's own counters at one moment."""

    at: float
    calls: dict[str, int]
    net_in: int
    net_out: int
    cpu_s: float

    def __sub__(self, other: Counters) -> Counters:
        calls = {name: n - other.calls.get(name, 0) for name, n in self.calls.items()}
        return Counters(self.at - other.at, {k: v for k, v in calls.items() if v}, self.net_in - other.net_in,
                        self.net_out - other.net_out, self.cpu_s - other.cpu_s)

    def scaled(self, factor: float) -> Counters:
        """These counters times `factor` (a rate over a duration)."""
        return Counters(self.at * factor, {k: round(v * factor) for k, v in self.calls.items()},
                        round(self.net_in * factor), round(self.net_out * factor), self.cpu_s * factor)

    @property
    def commands(self) -> int:
        """All commands counted (calls inside scripts and MULTI/EXEC included, as Redis counts them)."""
        return sum(self.calls.values())


def read_counters(client: object) -> Counters:
    """INFO commandstats, stats and cpu of the Redis `client` talks to."""
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    info = client.info()  # type: ignore[attr-defined]
    return Counters(time.monotonic(), calls, int(info["total_net_input_bytes"]), int(info["total_net_output_bytes"]),
                    float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))


def without_background(delta: Counters, background: Counters) -> Counters:
    """A phase's counters less what the idle background did over the same time."""
    share = background.scaled(delta.at / background.at)
    calls = {k: max(0, v - share.calls.get(k, 0)) for k, v in delta.calls.items()}
    return Counters(delta.at, calls, delta.net_in - share.net_in, delta.net_out - share.net_out,
                    max(0.0, delta.cpu_s - share.cpu_s))


def line(name: str, c: Counters, per: float) -> str:
    """One row: commands, bytes in/out and Redis CPU microseconds, divided by `per`."""
    return (f"{name:<34} {c.commands / per:>9.2f} cmds {c.net_in / per:>9.0f} B in {c.net_out / per:>9.0f} B out "
            f"{1e6 * c.cpu_s / per:>8.1f} us CPU")


def top_commands(c: Counters, per: float, n: int = 8) -> str:
    """The commands that made up most of a phase, per unit."""
    ordered = sorted(c.calls.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {calls / per:.2f}" for name, calls in ordered)


def measure_idle(cluster: Cluster, seconds: float) -> Counters:
    """Counters over `seconds` of whatever runs now (no requests)."""
    before = read_counters(cluster.client)
    time.sleep(seconds)
    return read_counters(cluster.client) - before


def spawn_standins(cluster: Cluster, count: int, rate: float, slots: int, model: str = STANDIN_MODEL) -> list:
    """Start `count` stand-ins of `model`."""
    return [cluster.spawn(f"standin-{len(cluster.procs)}", [PY, str(BENCH_DIR / "standin_worker.py"), "--model",
                                                              model, "--rate", str(rate), "--slots", str(slots)])
            for _ in range(count)]


def wait_workers(cluster: Cluster, count: int, timeout_s: float = 60) -> None:
    """Wait until `count` workers are in the registry index."""
    deadline = time.monotonic() + timeout_s
    while cluster.client.zcard(keys.WORKERS_INDEX) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} workers registered; see {cluster.logdir}")
        time.sleep(0.5)


def relay_phase(cluster: Cluster, pids: dict[str, int], streams: int, tokens: int, rate: float
                ) -> tuple[Counters, int, int]:
    """N streams of `tokens` through the gateway: the counters' delta, requests completed, tokens received."""
    before = read_counters(cluster.client)
    result = asyncio.run(run_relay("127.0.0.1", cluster.port, STANDIN_MODEL, streams, tokens, pids,
                                   timeout_s=tokens / rate + 120, api_key=API_KEY))
    delta = read_counters(cluster.client) - before
    if result.errors or result.completed < streams:
        print(f"  warning: {result.completed}/{streams} completed, errors {result.errors}", flush=True)
    return delta, result.completed, result.tokens


def split_costs(short: tuple[Counters, int, int], long: tuple[Counters, int, int]) -> tuple[Counters, Counters]:
    """Per-token and per-request counters from two runs of different lengths (least squares of two points)."""
    (cs, rs, ts), (cl, rl, tl) = short, long
    # cost = r * per_request + t * per_token; requests equal or not, solve the 2x2 system
    det = rs * tl - rl * ts
    if det == 0:
        raise RuntimeError("the two runs must differ in tokens per request")

    def solve(a: float, b: float) -> tuple[float, float]:
        return (a * tl - b * ts) / det, (rs * b - rl * a) / det  # (per request, per token)

    names = set(cs.calls) | set(cl.calls)
    per_req_calls, per_tok_calls = {}, {}
    for name in names:
        req, tok = solve(cs.calls.get(name, 0), cl.calls.get(name, 0))
        per_req_calls[name], per_tok_calls[name] = req, tok
    req_in, tok_in = solve(cs.net_in, cl.net_in)
    req_out, tok_out = solve(cs.net_out, cl.net_out)
    req_cpu, tok_cpu = solve(cs.cpu_s, cl.cpu_s)
    return (Counters(0, per_req_calls, req_in, req_out, req_cpu), Counters(0, per_tok_calls, tok_in, tok_out, tok_cpu))


def load_note() -> str:
    """The load average, for the reader of a shared machine's numbers."""
    return f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"


def run_standin_part(args: argparse.Namespace, cluster: Cluster) -> None:
    """Idle background, idle-worker cost, then the load levels and the split per request / per token."""
    first = spawn_standins(cluster, 1, args.rate, 4 * max(args.streams))[0]
    cluster.wait_model(STANDIN_MODEL, first, 60)
    background = measure_idle(cluster, args.idle_s)
    print(f"== background: 1 gateway + 1 idle stand-in, {args.idle_s:g} s {load_note()}")
    print(line("  per second", background, background.at), "|", top_commands(background, background.at))
    assert cluster.gateway is not None and cluster.redis is not None and cluster.redis.process is not None
    pids = {"gateway": cluster.gateway.pid, "stand-in": first.pid, "redis": cluster.redis.process.pid,
            "client": os.getpid()}
    for streams in args.streams:
        runs = []
        for tokens in (args.short, args.long):
            delta, done, received = relay_phase(cluster, pids, streams, tokens, args.rate)
            net = without_background(delta, background)
            runs.append((net, done, received))
            print(f"== {streams} streams x {tokens} tokens at {args.rate:g} tok/s: {done} completed, {received} tokens "
                  f"in {delta.at:.1f} s; Redis CPU {delta.cpu_s / delta.at:.0%} of one core, "
                  f"{delta.commands / delta.at:,.0f} cmds/s {load_note()}")
            print(line("  per token (all costs)", net, max(1, received)))
        per_request, per_token = split_costs(runs[0], runs[1])
        print(line("  split: per request", per_request, 1), "|", top_commands(per_request, 1))
        print(line("  split: per token", per_token, 1), "|", top_commands(per_token, 1))
        print_ceiling(per_request, per_token, args)
    if args.idle_workers:
        measure_idle_workers(args, cluster, background)


def measure_idle_workers(args: argparse.Namespace, cluster: Cluster, background: Counters) -> None:
    """What each further idle stand-in adds (of another model: placement never sends them the load's jobs)."""
    extra = spawn_standins(cluster, args.idle_workers, args.rate, 16, IDLE_MODEL)
    wait_workers(cluster, 1 + args.idle_workers)
    idle = measure_idle(cluster, args.idle_s)
    more = without_background(idle, background)
    print(line(f"  per idle stand-in per second (+{args.idle_workers})", more, args.idle_workers * idle.at), "|",
          top_commands(more, args.idle_workers * idle.at))
    for proc in extra:
        cluster.stop(proc)


def print_ceiling(per_request: Counters, per_token: Counters, args: argparse.Namespace) -> None:
    """Tokens/s and streams one Redis core carries at the measured CPU per token and per request."""
    for tokens in (args.short, args.long, 500):
        cpu = per_token.cpu_s + per_request.cpu_s / tokens
        if cpu <= 0:
            print("  ceiling: the CPU delta was too small to measure")
            return
        tps = 1 / cpu
        print(f"  ceiling at {tokens} tokens/request: {tps:,.0f} tok/s on one Redis core = {tps / args.rate:,.0f} "
              f"streams at {args.rate:g} tok/s")


def run_real_part(args: argparse.Namespace, cluster: Cluster) -> None:
    """The counters around streams of a real worker (fenced publish), split as for the stand-in; and what the
    idle worker costs over the gateway alone."""
    gateway_alone = measure_idle(cluster, args.idle_s)
    worker = cluster.spawn("worker", [PY, "-m", "llmfleet.cli", "worker", "--model", args.real,
                                      "--slots", str(args.real_streams)])
    name = model_id(args.real)
    cluster.wait_model(name, worker, 600)
    base = cluster.url
    asyncio.run(run_level(base, name, 1, 4, API_KEY, True, 300, "warm-up"))
    background = measure_idle(cluster, args.idle_s)
    idle = without_background(background, gateway_alone)
    print(line(f"== real worker {name} idle, per second", idle, idle.at), "|", top_commands(idle, idle.at))
    runs = []
    for tokens in (args.real_short, args.real_long):
        before = read_counters(cluster.client)
        level = asyncio.run(run_level(base, name, args.real_streams, tokens, API_KEY, True, 600, f"real{tokens}"))
        net = without_background(read_counters(cluster.client) - before, background)
        received = args.real_streams * tokens
        runs.append((net, args.real_streams, received))
        print(f"== real worker {name}: {args.real_streams} streams x {tokens} tokens, steady "
              f"{level.steady_rate:.0f} tok/s {load_note()}")
        print(line("  per token (all costs)", net, received))
    per_request, per_token = split_costs(runs[0], runs[1])
    print(line("  split: per request", per_request, 1), "|", top_commands(per_request, 1))
    print(line("  split: per token", per_token, 1), "|", top_commands(per_token, 1))
    cluster.stop(worker)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="50,200", help="concurrent streams per load level")
    parser.add_argument("--short", type=int, default=16, help="tokens per request of the short run")
    parser.add_argument("--long", type=int, default=128, help="tokens per request of the long run")
    parser.add_argument("--rate", type=float, default=20.0, help="stand-in tokens/s per stream")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--idle-workers", type=int, default=8, help="extra idle stand-ins for the per-worker cost")
    parser.add_argument("--real", default=None, metavar="MODEL", help="also measure a real worker of this model")
    parser.add_argument("--real-streams", type=int, default=8)
    parser.add_argument("--real-short", type=int, default=16, help="tokens per request of the real short run")
    parser.add_argument("--real-long", type=int, default=64, help="tokens per request of the real long run")
    args = parser.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; every process it started is stopped, whatever happens."""
    args = parse_args(argv)
    logdir = Path(tempfile.mkdtemp(prefix="llmfleet-capacity-"))
    cluster = Cluster(logdir, queue_limit=max(256, 4 * max(args.streams)))
    ok = False
    try:
        cluster.start()
        run_standin_part(args, cluster)
        if args.real:
            for proc in [p for p in cluster.procs if p is not cluster.gateway]:
                cluster.stop(proc)
            run_real_part(args, cluster)
        ok = True
    finally:
        cluster.close()
        if ok:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"process logs in {logdir}", flush=True)


if __name__ == "__main__":
    main()
