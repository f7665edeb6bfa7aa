"""Cluster benchmark: full-path streaming tok/s against the engine alone, gateway relay capacity, and a peer.

1. Full path (HTTP -> gateway -> Redis -> worker -> SSE) with the real model, at each concurrency, against
   the scheduler alone (bench/batching.py's scheduler_decode_rate in a child process), measured just before
   each level while the worker sits idle, so the two never compute at once: overhead = 1 - full / direct.
2. Relay: one gateway in front of bench/standin_worker.py (a fixed-rate stand-in engine), driven by N
   concurrent streams from a lean asyncio client: streams held, tokens/s relayed, added latency.
3. --peer URL: the part-1 load against any OpenAI-compatible server, side by side ("self" = our gateway);
   --peer llama-server: llama.cpp's server and `llmfleet serve` (defaults) started here, one after the other
   (bench/peer_llama.py).
Run: python bench/cluster.py [--sizes 1,4,16,32] [--max-tokens 32] [--relay-streams 1000] [--relay-rate 20]
     [--skip-full] [--skip-relay] [--peer URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from cluster_processes import Cluster  # noqa: E402
from relay_client import RelayResult, cpu_seconds, run_relay  # noqa: E402
from stream_load import LevelResult, peer_model, run_level, run_levels  # noqa: E402

from worker.models import model_id  # noqa: E402

PY = sys.executable
STANDIN_MODEL = "standin"
API_KEY = os.environ.get("LLMFLEET_API_KEY", "none")  # what our gateway expects, if it expects one


# ---- engine alone -----------------------------------------------------------------------------------------


def serve_direct(model: str) -> None:
    """Child-process mode: load the engine, then answer each stdin line "BATCH STEPS" with a JSON rate."""
    from batching import scheduler_decode_rate

    from worker.engine.engine import Engine
    from worker.models import resolve

    engine = Engine.load(resolve(model))
    scheduler_decode_rate(engine, 2, 2)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        batch, steps = (int(v) for v in line.split())
        started = time.process_time()
        rate = scheduler_decode_rate(engine, batch, steps)
        print(json.dumps({"rate": rate, "cpu_s": time.process_time() - started}), flush=True)


class DirectEngine:
    """The scheduler alone in a child process, idle (blocked on stdin) except while it measures."""

    def __init__(self, cluster: Cluster, model: str) -> None:
        self.proc = cluster.spawn("direct", [PY, __file__, "--direct-serve", "--model", model],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _line(self) -> str:
        line = self.proc.stdout.readline().decode()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the engine-alone child exited with code {self.proc.wait()}")
        return line

    def wait_ready(self) -> None:
        """Block until the engine is loaded and warm."""
        while self._line().strip() != "ready":
            pass

    def rate(self, batch: int, steps: int) -> float:
        """Aggregate decode tok/s of `batch` greedy sequences over `steps` steps (bench/batching.py)."""
        self.proc.stdin.write(f"{batch} {steps}\n".encode())  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return float(json.loads(self._line())["rate"])


# ---- reports ------------------------------------------------------------------------------------------------


def print_full(levels: list[LevelResult], direct: dict[int, float]) -> None:
    """The full-path table with the engine-alone baseline and the overhead ratio."""
    print(f"{'streams':>7} {'direct tok/s':>12} {'full steady':>11} {'overhead':>8} {'full e2e':>9} "
          f"{'TTFT p50':>9} {'tokens':>6} {'errors':>6}")
    for lv in levels:
        base = direct.get(lv.size, float("nan"))
        print(f"{lv.size:>7} {base:>12.2f} {lv.steady_rate:>11.2f} {1 - lv.steady_rate / base:>8.1%} "
              f"{lv.e2e_rate:>9.2f} {lv.ttft_p50_s * 1000:>7.0f}ms {lv.tokens:>6} {len(lv.errors):>6}  {lv.note}")
        for error in sorted(set(lv.errors)):
            print(f"        error x{lv.errors.count(error)}: {error}")


def print_peer(ours: list[LevelResult] | None, peer: list[LevelResult], name: str) -> None:
    """Ours and the peer's rates side by side at each concurrency."""
    print(f"{'streams':>7} {'ours steady':>11} {'ours e2e':>9} {'ours TTFT':>9} | {'peer steady':>11} "
          f"{'peer e2e':>9} {'peer TTFT':>9} {'peer/ours':>9}   (peer: {name})")
    for i, p in enumerate(peer):
        o = ours[i] if ours else None
        ours_cols = (f"{o.steady_rate:>11.2f} {o.e2e_rate:>9.2f} {o.ttft_p50_s * 1000:>7.0f}ms" if o
                     else f"{'-':>11} {'-':>9} {'-':>9}")
        ratio = f"{p.e2e_rate / o.e2e_rate:>8.2f}x" if o and o.e2e_rate else f"{'-':>9}"
        print(f"{p.size:>7} {ours_cols} | {p.steady_rate:>11.2f} {p.e2e_rate:>9.2f} {p.ttft_p50_s * 1000:>7.0f}ms "
              f"{ratio}{'  errors: ' + ', '.join(sorted(set(p.errors))) if p.errors else ''}")


def print_relay(r: RelayResult, streams: int, rate: float, tokens: int, standin: dict[str, float]) -> None:
    """The relay report: streams held, tok/s, added latency, CPU shares, a timeline and the aim."""
    print(f"streams requested {streams}, completed {r.completed}, failed {sum(r.errors.values())}"
          f"{' ' + json.dumps(r.errors) if r.errors else ''}")
    print(f"held concurrently: peak {r.peak_open} open in the gateway, peak {r.peak_streaming} streaming "
          f"(200 headers come after each stream's first event)")
    print(f"tokens received {r.tokens} of {streams * tokens} expected; out of order or missing: {r.misordered}; "
          f"wall {r.wall_s:.1f}s, overall {r.tokens / r.wall_s:,.0f} tok/s (offered {streams * rate:,.0f} tok/s "
          f"while every stream is live)")
    best = max((b[1] for b in r.timeline), default=0.0)
    if r.window_s > 0:
        print(f"steady window (all {streams} streams streaming) {r.window_s:.1f}s: {r.window_rate:,.0f} tok/s; "
              f"added latency p50 {r.window_lat['p50'] * 1000:.1f} ms, p99 {r.window_lat['p99'] * 1000:.1f} ms")
    else:
        print(f"no steady window (never all {streams} streaming at once); best 5 s: {best:,.0f} tok/s")
    print(f"added latency, all tokens: p50 {r.all_lat['p50'] * 1000:.1f} ms, p90 {r.all_lat['p90'] * 1000:.1f} ms, "
          f"p99 {r.all_lat['p99'] * 1000:.1f} ms, max {r.all_lat['max'] * 1000:.1f} ms  (stand-in publish stamp -> "
          f"SSE chunk read; includes the stand-in's build p50 {standin.get('build_ms_p50', 0):.1f} / "
          f"p99 {standin.get('build_ms_p99', 0):.1f} ms and MULTI/EXEC p50 {standin.get('execute_ms_p50', 0):.1f} "
          f"/ p99 {standin.get('execute_ms_p99', 0):.1f} ms)")
    events = standin.get("events", 0)
    print(f"stand-in (whole part 2): {standin.get('ticks', 0):.0f} ticks ({standin.get('late_ticks', 0):.0f} late), {events:.0f} "
          f"events, {standin.get('jobs', 0):.0f} jobs, {standin['cpu_s'] / max(events, 1) * 1e6:.0f} us CPU per event")
    print("timeline: " + " | ".join(f"{t:.0f}s {v:,.0f} tok/s {o}/{st} gw {g:.0%}" for t, v, o, st, g in r.timeline)
          + "   (tok/s, open/streaming, gateway CPU)")
    shares = ", ".join(f"{name} {share:.0%}" for name, share in r.cpu_share.items())
    print(f"CPU {'in the window' if r.window_s > 0 else 'over the run'} (of one core; {os.cpu_count()} cores, "
          f"shared with whatever else runs): {shares}")
    measured = r.window_rate if r.window_s > 0 else r.tokens / r.wall_s
    gw = r.cpu_share.get("gateway", 0.0)
    if gw > 0:
        print(f"gateway: {gw / measured * 1e6:.0f} us of CPU per relayed token -> one fully busy gateway core "
              f"would relay ~{measured / gw:,.0f} tok/s")
    held = r.peak_streaming
    verdict = "met" if measured >= 20_000 and held >= 1000 else "NOT met"
    print(f"aim (>= 20,000 tok/s to 1,000 concurrent streams): {verdict}: {measured:,.0f} tok/s "
          f"({measured / 20_000:.0%} of it), {held} streams streaming at once")


PROFILE_STAGES = {  # label -> the frame (function (file) prefix) whose inclusive time it is
    "admission: parse, queue the job, wait for the first event": "stream_completion (gateway/replies/serving.py",
    "pub/sub read + RESP parse (dispatcher task)": "Subscriber._run (gateway/cluster/subscriber.py",
    "event decode (shared.codec)": "decode_event (shared/codec.py",
    "per-event wait (asyncio.wait_for on the queue)": "EventStream._receive (gateway/cluster/event_stream.py",
    "chunk dicts (gateway/replies/bodies.py)": "completion_chunk (gateway/replies/bodies.py",
    "json.dumps + SSE framing": "event (gateway/http/sse.py",
    "send path (Starlette/uvicorn h11 send)": "RequestResponseCycle.send (uvicorn/",
    "  of which socket send() syscalls": "_SelectorSocketTransport.write (asyncio/selector_events.py",
}


def profile_summary(raw: Path, top: int = 8) -> list[str]:
    """A py-spy raw (collapsed) profile of the gateway: inclusive time per relay stage, hottest own frames."""
    own: dict[str, int] = {}
    stages = dict.fromkeys(PROFILE_STAGES, 0)
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for label, prefix in PROFILE_STAGES.items():
            if any(f.startswith(prefix) for f in frames):
                stages[label] += n
    lines = [f"py-spy: {total} samples of the gateway's busy time; inclusive time by stage:"]
    lines += [f"  {n / total:6.1%} {label}" for label, n in stages.items()]
    lines.append("hottest own frames:")
    lines += [f"  {n / total:6.1%} {f}" for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    return lines


def gateway_stack() -> str:
    """Which event loop and HTTP parser uvicorn's 'auto' picks in this environment."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"uvicorn on {loop} + {http}"


# ---- main ------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", default="1,4,16,32", help="concurrent streams for parts 1 and 3")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per stream in parts 1 and 3")
    parser.add_argument("--direct-steps", type=int, default=None, help="decode steps timed per size, engine "
                        "alone (default: max-tokens - 2, about the full path's steady window)")
    parser.add_argument("--relay-streams", type=int, default=1000)
    parser.add_argument("--relay-rate", type=float, default=20.0, help="stand-in tokens/s per stream")
    parser.add_argument("--relay-tokens", type=int, default=100, help="max_tokens of each relay stream")
    parser.add_argument("--relay-light", type=int, default=100, help="streams of a light-load relay run first "
                        "(the latency floor; 0 = skip)")
    parser.add_argument("--skip-full", action="store_true")
    parser.add_argument("--skip-relay", action="store_true")
    parser.add_argument("--peer", default=None, help="base URL of an OpenAI-compatible server ('self' = ours; "
                        "'llama-server' = build/start llama.cpp's server and `llmfleet serve`, compare them)")
    parser.add_argument("--peer-model", default=None, help="default: the first model the peer lists")
    parser.add_argument("--peer-api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--no-ignore-eos", action="store_true", help="for peers that reject ignore_eos")
    parser.add_argument("--py-spy", default=None, metavar="PATH", help="py-spy binary: profile the gateway "
                        "during the relay (a separate run: the sampler takes CPU from this 2-core box)")
    parser.add_argument("--py-spy-seconds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=3, help="part 1: best of this many runs per size")
    parser.add_argument("--keep-logs", action="store_true", help="keep the children's logs (always kept on failure)")
    parser.add_argument("--direct-serve", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def raise_open_files(needed: int) -> None:
    """Raise the soft RLIMIT_NOFILE (children inherit it) so many streams can be open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else min(hard, needed), hard))


def load_note() -> str:
    """The 1-minute load average: other processes on this machine skew every number."""
    return f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"


def run(args: argparse.Namespace, cluster: Cluster) -> None:
    """Parts 1 and 3, then part 2; the worker and the engine-alone child never compute at the same time."""
    sizes = [int(s) for s in args.sizes.split(",")]
    ours: list[LevelResult] | None = None
    if not (args.skip_full and args.skip_relay) or args.peer == "self":
        cluster.start()
    if not args.skip_full:
        ours = run_full_part(args, cluster, sizes)
    elif args.peer == "self":  # "self" needs a live worker even without part 1
        worker = cluster.spawn("worker", [PY, "-m", "llmfleet.cli", "worker", "--model", args.model,
                                          "--slots", str(max(sizes))])
        cluster.wait_model(model_id(args.model), worker, 300)
    if args.peer:
        base = cluster.url if args.peer == "self" else args.peer.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        name = args.peer_model or peer_model(base, args.peer_api_key)
        print(f"== peer {base} model {name} {load_note()}", flush=True)
        peer = asyncio.run(run_levels(base, name, sizes, args.max_tokens, args.peer_api_key, not args.no_ignore_eos))
        print_peer(ours, peer, name)
    for proc in [p for p in cluster.procs if p is not cluster.gateway]:
        cluster.stop(proc)  # the real worker and the engine-alone child
    if not args.skip_relay:
        run_relay_part(args, cluster)


def run_full_part(args: argparse.Namespace, cluster: Cluster, sizes: list[int]) -> list[LevelResult]:
    """Part 1: per size, the engine alone (worker idle) then the full path (engine child idle), best of --repeat."""
    direct = DirectEngine(cluster, args.model)
    worker = cluster.spawn("worker", [PY, "-m", "llmfleet.cli", "worker", "--model", args.model,
                                      "--slots", str(max(sizes))])
    direct.wait_ready()
    model = model_id(args.model)
    cluster.wait_model(model, worker, 300)
    print(f"== full path (HTTP -> gateway -> Redis -> 1 worker -> SSE, max_tokens {args.max_tokens}) against the "
          f"scheduler alone ({args.direct_steps} decode steps), interleaved, best of {args.repeat} "
          f"{load_note()}", flush=True)
    asyncio.run(run_level(cluster.url, model, 1, 4, API_KEY, True, 120, "warm-up"))
    rates: dict[int, float] = {}
    levels: list[LevelResult] = []
    pids = {"worker": worker.pid, "gateway": cluster.gateway.pid, "redis": cluster.redis.process.pid,  # type: ignore[union-attr]
            "client": os.getpid()}
    for size in sizes:
        best: LevelResult | None = None
        for rep in range(args.repeat):
            before, child, started = cpu_seconds(worker.pid), cpu_seconds(direct.proc.pid), time.monotonic()
            rates[size] = max(rates.get(size, 0.0), direct.rate(size, args.direct_steps))
            elapsed = time.monotonic() - started
            idle_share, direct_cores = (cpu_seconds(worker.pid) - before) / elapsed, (cpu_seconds(direct.proc.pid) - child) / elapsed
            before_all, started = {n: cpu_seconds(p) for n, p in pids.items()}, time.monotonic()
            level = asyncio.run(run_level(cluster.url, model, size, args.max_tokens, API_KEY, True, 300, f"ours {rep}"))
            shares = {n: (cpu_seconds(p) - before_all[n]) / (time.monotonic() - started) for n, p in pids.items()}
            level.note = (f"load {os.getloadavg()[0]:.1f}; cores: direct {direct_cores:.2f} (idle worker {idle_share:.2f}); "
                          "full: " + " ".join(f"{n} {v:.2f}" for n, v in shares.items()))
            if best is None or _rank(level) > _rank(best):
                best = level
        assert best is not None
        levels.append(best)
    print_full(levels, rates)
    return levels


def _rank(level: LevelResult) -> float:
    """Best-of order: the steady rate, a level without one (nan) last."""
    return level.steady_rate if level.steady_rate == level.steady_rate else float("-inf")


def run_relay_part(args: argparse.Namespace, cluster: Cluster) -> None:
    """Part 2: the stand-in behind the gateway, N streams from this process, optionally py-spy on the gateway."""
    stats_file = cluster.logdir / "standin.json"
    standin = cluster.spawn("standin", [PY, str(BENCH_DIR / "standin_worker.py"), "--model", STANDIN_MODEL,
                                        "--rate", str(args.relay_rate), "--slots", str(2 * args.relay_streams),
                                        "--stats-file", str(stats_file)])
    cluster.wait_model(STANDIN_MODEL, standin, 60)
    print(f"== relay: {args.relay_streams} streams x {args.relay_tokens} tokens at {args.relay_rate:g} tok/s each "
          f"through one gateway ({gateway_stack()}) {load_note()}", flush=True)
    assert cluster.gateway is not None and cluster.redis.process is not None
    pids = {"gateway": cluster.gateway.pid, "stand-in": standin.pid, "redis": cluster.redis.process.pid,
            "client": os.getpid()}
    if args.relay_light:
        light = asyncio.run(run_relay("127.0.0.1", cluster.port, STANDIN_MODEL, args.relay_light, args.relay_tokens,
                                      pids, timeout_s=args.relay_tokens / args.relay_rate + 60, api_key=API_KEY))
        rate = light.window_rate if light.window_s > 0 else light.tokens / light.wall_s
        print(f"light load first: {args.relay_light} streams, {light.completed} completed, {rate:,.0f} tok/s "
              f"(offered {args.relay_light * args.relay_rate:,.0f}), added latency p50 "
              f"{(light.window_lat or light.all_lat)['p50'] * 1000:.1f} ms, p99 "
              f"{(light.window_lat or light.all_lat)['p99'] * 1000:.1f} ms, gateway CPU "
              f"{light.cpu_share.get('gateway', 0):.0%}", flush=True)
    spy = None
    if args.py_spy:
        raw = cluster.logdir / "gateway-profile.txt"
        spy = subprocess.Popen([args.py_spy, "record", "--pid", str(cluster.gateway.pid), "--rate", "100",
                                "--duration", str(args.py_spy_seconds), "--format", "raw", "--nonblocking",
                                "--output", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cluster.procs.append(spy)
    result = asyncio.run(run_relay("127.0.0.1", cluster.port, STANDIN_MODEL, args.relay_streams, args.relay_tokens,
                                   pids, timeout_s=args.relay_tokens / args.relay_rate + 120, api_key=API_KEY))
    standin_cpu_s = cpu_seconds(standin.pid)
    cluster.stop(standin)
    stats = {**(json.loads(stats_file.read_text()) if stats_file.exists() else {}), "cpu_s": standin_cpu_s}
    print_relay(result, args.relay_streams, args.relay_rate, args.relay_tokens, stats)
    if spy is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(timeout=args.py_spy_seconds + 10)  # it writes the profile when its duration is over
        cluster.stop(spy)
        print("\n".join(profile_summary(raw)) if raw.exists() else "py-spy wrote no profile")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; every process it started is stopped, whatever happens."""
    args = parse_args(argv)
    args.direct_steps = args.direct_steps or max(4, args.max_tokens - 2)
    if args.direct_serve:
        serve_direct(args.model)
        return
    if args.peer == "llama-server":  # both systems started here, side by side (bench/peer_llama.py)
        from peer_llama import main as peer_llama_main

        peer_llama_main(["--model", args.model, "--sizes", args.sizes, "--max-tokens", str(args.max_tokens)])
        return
    raise_open_files(4 * args.relay_streams + 1024)
    logdir = Path(tempfile.mkdtemp(prefix="llmfleet-bench-"))
    cluster = Cluster(logdir, queue_limit=max(256, 2 * args.relay_streams))
    signal.signal(signal.SIGTERM, _interrupt)
    started, ok = time.monotonic(), False
    try:
        run(args, cluster)
        ok = True
    except KeyboardInterrupt:
        print("interrupted: stopping everything this benchmark started", file=sys.stderr, flush=True)
    finally:
        cluster.close()
        if ok and not args.keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)
        print(f"total {time.monotonic() - started:.0f}s" + ("" if ok and not args.keep_logs else
                                                            f"; process logs in {logdir}"), flush=True)
    if not ok:
        sys.exit(130)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
