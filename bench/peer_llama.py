"""llmfleet (`llmfleet serve` with its defaults) against llama.cpp's llama-server on the same box, one run.

Both serve the same GGUF file and run side by side for the whole run (the one not measured waits idle). The
same streaming /v1/completions load (N concurrent streams, distinct short prompts, greedy, exactly --max-tokens
tokens each) runs per size against one system, then at once against the other, so that both meet the same
phase of a shared machine's load (which can move rates 20-40% for minutes); the first of the pair alternates
per round. Each row reports aggregate tok/s (steady: while every stream decodes), median TTFT and
inter-token latency, and the ratio llmfleet / llama-server; then one --long-prompt (1,000-token) prompt
alone gives each one's TTFT (prompts are distinct per round and system: no prefix cache serves them).
The machine's memory read bandwidth is measured first (bench/memory_bandwidth.py), and the single-stream rate is
put beside it: a decode step reads about the whole file (every weight once), so file bytes x tok/s is the rate at
which a step reads memory.
llama-server runs with -t <cores> -np <largest N> -c <N x max(256, 2 x long prompt)>.
Run: python bench/cluster.py --peer llama-server [--sizes 1,4,16,32,64] [--max-tokens 128] [--rounds 2]
     (or python bench/peer_llama.py ...; --llama-server PATH skips ../shared/peers/build-llama-server.sh)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from cluster_processes import http_status, wait_until  # noqa: E402
from memory_bandwidth import read_bandwidth_gbs  # noqa: E402
from stream_load import LevelResult, long_prompt_ttft, run_level  # noqa: E402

from llmfleet.redis_server import free_port  # noqa: E402
from worker.models import model_id, resolve  # noqa: E402

BUILD_SCRIPT = BENCH_DIR.parent.parent / "shared" / "peers" / "build-llama-server.sh"


def llama_server_binary(given: str | None) -> str:
    """The llama-server binary: --llama-server, else the peers build script's (built once, cached)."""
    if given:
        return given
    if not BUILD_SCRIPT.exists():
        raise SystemExit(f"no --llama-server given and {BUILD_SCRIPT} is missing")
    return subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True).stdout.strip()


class System:
    """One server under test, started and stopped around its measurements."""

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str, logdir: Path) -> None:
        self.name, self.argv, self.port, self.ready_path, self.logdir = name, argv, port, ready_path, logdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        """The /v1 base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Start it and wait until it answers its readiness URL."""
        log = open(self.logdir / f"{self.name}.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=BENCH_DIR.parent,
                                     start_new_session=True)
        url = f"http://127.0.0.1:{self.port}{self.ready_path}"
        wait_until(lambda: self._alive() and http_status(url) == 200, 600, f"{self.name} ready")

    def _alive(self) -> bool:
        """True while the process runs; a process that exited raises, with the end of its log."""
        assert self.proc is not None
        if self.proc.poll() is None:
            return True
        tail = (self.logdir / f"{self.name}.log").read_bytes()[-3000:].decode(errors="replace")
        raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready:\n{tail}")

    def stop(self) -> None:
        """SIGINT (llmfleet serve drains), then SIGKILL the whole group after a grace period."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 2)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def warm_up(system: System, model: str) -> None:
    """One short request, so that a first request's one-time costs stay out of the measurements."""
    asyncio.run(run_level(system.base, model, 1, 4, "none", True, 120, f"warm-up {system.name}"))


def measure_level(system: System, model: str, size: int, max_tokens: int, tag: str) -> LevelResult:
    """One size against one system (its steady rate printed as it ends)."""
    level = asyncio.run(run_level(system.base, model, size, max_tokens, "none", True, 600, f"{tag} {size}"))
    print(f"   {system.name} {tag}, {size} streams: {level.steady_rate:.1f} tok/s steady, {level.e2e_rate:.1f} "
          "end to end", flush=True)
    return level


def measure_long_prompt(system: System, model: str, tokens: int, tag: str) -> tuple[float, int]:
    """TTFT of one long prompt alone on an idle system, and its prompt tokens."""
    ttft, counted = asyncio.run(long_prompt_ttft(system.base, model, tokens, "none", f"{system.name} {tag}"))
    print(f"   {system.name} {tag}: TTFT {ttft:.2f}s for a {counted or '~' + str(tokens)}-token prompt", flush=True)
    return ttft, counted


def main(argv: list[str] | None = None) -> None:
    """Start both systems, measure each size on the two in turn every round, print the table with ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", default="1,4,16,32,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="each size measured this many times on each system")
    parser.add_argument("--llama-server", default=None, help="path of a llama-server binary")
    parser.add_argument("--serve-args", default="", help="extra flags for `llmfleet serve` (default: none)")
    parser.add_argument("--long-prompt", type=int, default=1000, help="tokens of the TTFT prompt (0: skip)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    path = resolve(args.model, progress=True)
    binary = llama_server_binary(args.llama_server)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="llmfleet-peer-") as tmp:
        logdir = Path(tmp)
        lport, fport = free_port(), free_port()
        context = max(sizes) * max(256, 2 * args.long_prompt)  # every slot fits the long prompt (tokens vary by model)
        llama = System("llama-server", [binary, "-m", str(path), "-t", str(cores), "-np", str(max(sizes)),
                                        "-c", str(context), "--port", str(lport), "--host", "127.0.0.1"],
                       lport, "/health", logdir)
        fleet = System("llmfleet", [sys.executable, "-m", "llmfleet.cli", "serve", "--model", args.model,
                                    "--port", str(fport), *args.serve_args.split()], fport, "/ready", logdir)
        bandwidth = max(read_bandwidth_gbs().values())
        env_note = f"load average {os.getloadavg()[0]:.2f} on {cores} cores; memory read bandwidth {bandwidth:.1f} GB/s"
        print(f"== {path.name}: streaming /v1/completions, {args.max_tokens} tokens, greedy; llama-server -t {cores} "
              f"-np {max(sizes)} -c {context}; llmfleet serve {args.serve_args or '(defaults)'}; {env_note}",
              flush=True)
        results: dict[str, list[list[LevelResult]]] = {"llama-server": [], "llmfleet": []}
        long_ttft: dict[str, list[float]] = {"llama-server": [], "llmfleet": []}
        models = {llama.name: "model", fleet.name: model_id(args.model)}
        try:
            for system in (llama, fleet):
                started = time.monotonic()
                system.start()
                warm_up(system, models[system.name])
                print(f"   {system.name} ready and warm in {time.monotonic() - started:.0f}s", flush=True)
            for round_ in range(args.rounds):
                started = time.monotonic()
                pair = (llama, fleet) if round_ % 2 == 0 else (fleet, llama)
                for system in pair:
                    results[system.name].append([])
                for size in sizes:
                    for system in pair:
                        results[system.name][-1].append(measure_level(system, models[system.name], size,
                                                                      args.max_tokens, f"r{round_}"))
                if args.long_prompt:
                    for system in pair:
                        ttft, _ = measure_long_prompt(system, models[system.name], args.long_prompt, f"r{round_}")
                        long_ttft[system.name].append(ttft)
                print(f"   round {round_ + 1}: {time.monotonic() - started:.0f}s", flush=True)
        finally:
            llama.stop()
            fleet.stop()
    print_table(sizes, results)
    if 1 in sizes:
        print_bandwidth_share(path.stat().st_size, bandwidth, {name: _best(rounds, sizes.index(1)).steady_rate
                                                               for name, rounds in results.items()})
    if args.long_prompt:
        best = {name: min(times) for name, times in long_ttft.items()}
        print(f"TTFT of a ~{args.long_prompt}-token prompt, best of {args.rounds}: llama-server "
              f"{best['llama-server']:.2f}s, llmfleet {best['llmfleet']:.2f}s "
              f"(llmfleet / llama-server {best['llmfleet'] / best['llama-server']:.2f}x)")


def print_bandwidth_share(file_bytes: int, bandwidth_gbs: float, single_stream: dict[str, float]) -> None:
    """Each system's single-stream decode as the memory rate it implies (file bytes x tok/s) and its share of the
    measured bandwidth."""
    for name, rate in single_stream.items():
        reads = file_bytes * rate / 1e9
        print(f"single stream, {name}: {rate:.1f} tok/s x {file_bytes / 1e9:.2f} GB = {reads:.1f} GB/s, "
              f"{reads / bandwidth_gbs:.0%} of the measured {bandwidth_gbs:.1f} GB/s")


def _best(rounds: list[list[LevelResult]], i: int) -> LevelResult:
    """The round with the best steady rate at size index i (nan last)."""
    return max((r[i] for r in rounds), key=lambda lv: lv.steady_rate if lv.steady_rate == lv.steady_rate else -1)


def print_table(sizes: list[int], results: dict[str, list[list[LevelResult]]]) -> None:
    """Per size: both systems' best steady tok/s (range over rounds), TTFT and ITL p50, and the ratio."""
    print(f"{'streams':>7} | {'llama-server tok/s':>20} {'TTFT':>7} {'ITL':>6} | {'llmfleet tok/s':>20} {'TTFT':>7} "
          f"{'ITL':>6} | {'ratio':>6}")
    for i, n in enumerate(sizes):
        cells = []
        for name in ("llama-server", "llmfleet"):
            best = _best(results[name], i)
            rates = [r[i].steady_rate for r in results[name]]
            spread = f"{min(rates):.0f}-{max(rates):.0f}" if len(rates) > 1 else ""
            errors = sum(len(r[i].errors) for r in results[name])
            cells.append(f"{best.steady_rate:>8.1f} ({spread:>9}) {best.ttft_p50_s * 1000:>5.0f}ms "
                         f"{best.itl_p50_s * 1000:>4.0f}ms" + (f" [{errors} errors]" if errors else ""))
        ratio = _best(results["llmfleet"], i).steady_rate / _best(results["llama-server"], i).steady_rate
        e2e = {name: max(r[i].e2e_rate for r in results[name]) for name in ("llama-server", "llmfleet")}
        print(f"{n:>7} | {cells[0]} | {cells[1]} | {ratio:>5.2f}x   end to end {e2e['llama-server']:.1f} vs "
              f"{e2e['llmfleet']:.1f}: {e2e['llmfleet'] / e2e['llama-server']:.2f}x")
        for name in ("llama-server", "llmfleet"):
            kinds = collections.Counter(e for r in results[name] for e in r[i].errors)
            if kinds:
                print(f"        {name} errors at {n} streams: {dict(kinds.most_common(3))}")


if __name__ == "__main__":
    main()
