"""Soak: N official-SDK clients against a cluster under faults, with a ledger that every request ended once.

A bundled Redis, one gateway and W SmolLM2 workers, all reaching Redis through bench/delay_proxy.py (the RTT
under test, e.g. 1 ms). For --duration seconds, N client threads (openai SDK, no retries) send streamed and
plain completions and chats; one in ten streams is dropped by its client after a few chunks (a cancel).
Meanwhile kill -9 of a random worker every 20-40 s (restarted at once under a fresh id, as `llmfleet serve`
does) and one Redis pause (SIGSTOP for --pause-s, then SIGCONT) mid-run. The phase runs once at 0 ms RTT and
once at --rtt-ms (same faults), so the p99 latency of requests clear of every fault window is compared in one
run.

The ledger (JSON lines, --ledger) holds every request: client id, the server's id, kind, start/end, outcome
(completed, cancelled, failed + reason) and, for streams, how many finish_reasons each choice got. Checked:
each request has exactly one outcome, no stream choice finished twice or not at all, nothing hung past the
client timeout, and after each phase no job is left pending or running anywhere (no orphaned work).

    python bench/soak.py --duration 150 --clients 8 --rtt-ms 1 --ledger /tmp/soak.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import openai
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_processes import PY, wait_until  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402

from llmfleet.redis_server import BundledRedis, free_port  # noqa: E402
from shared import keys  # noqa: E402

MODEL = "smollm2-135m"
CLIENT_TIMEOUT_S = 120.0
FAULT_MARGIN_S = 10.0  # a request overlapping [fault start, fault end + this] is in a fault window


@dataclass
class Entry:
    """One request as the client saw it."""

    client_id: str
    kind: str
    phase: str
    started: float
    ended: float = 0.0
    server_id: str = ""
    outcome: str = ""  # completed | cancelled | failed
    reason: str = ""
    finishes: dict[int, int] = field(default_factory=dict)  # choice index -> finish_reasons seen (streams)


class Phase:
    """One soak phase: its processes, its fault windows, its ledger entries."""

    def __init__(self, name: str, rtt_ms: float, workers: int, logdir: Path) -> None:
        self.name, self.logdir, self.workers_wanted = name, logdir, workers
        self.redis = BundledRedis().start()
        self.proxy = DelayProxy("127.0.0.1", self.redis.port, rtt_ms / 2000).start()
        self.url = f"redis://127.0.0.1:{self.proxy.port}/0"
        self.port = free_port()
        self.env = {**os.environ, "REDIS_URL": self.url, "LLMFLEET_PORT": str(self.port), "LLMFLEET_THREADS": "1"}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.faults: list[list[float]] = []  # [start, end]
        self.entries: list[Entry] = []
        self.p99 = float("nan")  # latency of the requests completed clear of every fault window
        self.lock = threading.Lock()

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start an llmfleet process with its output appended to a log file."""
        with (self.logdir / f"{self.name}-{name}.log").open("ab") as log:
            proc = subprocess.Popen([PY, "-m", "llmfleet.cli", *args], env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start(self) -> Phase:
        """Gateway and workers, up and registered."""
        self.spawn("gateway", ["gateway"])
        self.workers = [self.spawn(f"worker{i}", ["worker", "--model", MODEL]) for i in range(self.workers_wanted)]
        wait_until(lambda: _ready_workers(self.port) == self.workers_wanted, 300, "the workers")
        return self

    def stop(self) -> None:
        """Everything down (SIGTERM, then SIGKILL after 20 s)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proxy.close()
        self.redis.stop()


def _ready_workers(port: int) -> int:
    try:
        return int(httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).json().get("workers", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def one_request(client: openai.OpenAI, phase: Phase, rng: random.Random) -> Entry:
    """One request of a random kind; its ledger entry."""
    kind = rng.choices(["chat-stream", "completion", "chat", "drop-stream"], [5, 3, 1, 1])[0]
    entry = Entry(uuid.uuid4().hex[:12], kind, phase.name, time.time())
    tokens = rng.randint(8, 32)
    extra = {"ignore_eos": True}
    try:
        if kind == "completion":
            reply = client.completions.create(model=MODEL, prompt=f"Item {rng.randint(0, 999)}:", max_tokens=tokens,
                                              temperature=0, extra_body=extra)
            entry.server_id, entry.outcome = reply.id, "completed"
        elif kind == "chat":
            reply = client.chat.completions.create(model=MODEL, max_tokens=tokens, temperature=0, extra_body=extra,
                                                   messages=[{"role": "user", "content": f"Say {rng.random()}"}])
            entry.server_id, entry.outcome = reply.id, "completed"
        else:
            stream = client.chat.completions.create(model=MODEL, max_tokens=tokens, temperature=0, stream=True,
                                                    extra_body=extra, messages=[{"role": "user", "content":
                                                                                 f"Tell {rng.random()}"}])
            finishes: collections.Counter[int] = collections.Counter()
            for index, chunk in enumerate(stream):
                entry.server_id = chunk.id
                for choice in chunk.choices:
                    if choice.finish_reason:
                        finishes[choice.index] += 1
                if kind == "drop-stream" and index >= 3:
                    stream.close()  # the client goes away: the gateway cancels the job
                    entry.outcome = "cancelled"
                    break
            entry.finishes = dict(finishes)
            entry.outcome = entry.outcome or "completed"
    except openai.APIStatusError as exc:
        entry.outcome, entry.reason = "failed", f"{exc.status_code} {_code(exc)}"
    except openai.APIError as exc:
        entry.outcome, entry.reason = "failed", f"{type(exc).__name__}: {str(exc)[:120]}"
    entry.ended = time.time()
    return entry


def _code(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    return str((body.get("error") or body).get("code", "")) if isinstance(body, dict) else ""


def client_loop(phase: Phase, until: float, seed: int) -> None:
    """Requests back to back until `until`."""
    rng = random.Random(seed)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{phase.port}/v1", api_key="soak", max_retries=0,
                           timeout=CLIENT_TIMEOUT_S)
    while time.time() < until:
        entry = one_request(client, phase, rng)
        with phase.lock:
            phase.entries.append(entry)
        if entry.outcome == "failed":
            time.sleep(0.5)  # as a client honouring Retry-After would, roughly


def fault_loop(phase: Phase, until: float, pause_s: float, seed: int) -> None:
    """kill -9 a random worker every 20-40 s (restarted at once) and pause Redis once, half way."""
    rng = random.Random(seed)
    pause_at = time.time() + (until - time.time()) / 2
    next_kill = time.time() + rng.uniform(20, 40)
    while time.time() < until - 5:
        now = time.time()
        if pause_at and now >= pause_at:
            phase.redis.process.send_signal(signal.SIGSTOP)
            time.sleep(pause_s)
            phase.redis.process.send_signal(signal.SIGCONT)
            phase.faults.append([now, time.time()])
            pause_at = 0
        elif now >= next_kill:
            index = rng.randrange(len(phase.workers))
            phase.workers[index].kill()
            phase.workers[index].wait()
            phase.workers[index] = phase.spawn(f"worker{index}", ["worker", "--model", MODEL])
            phase.faults.append([now, now])
            next_kill = now + rng.uniform(20, 40)
        time.sleep(0.2)


def leftover_work(phase: Phase) -> tuple[int, int]:
    """(pending or waiting job entries over every stream of the model, sequences the workers report running)."""
    client = redis.Redis.from_url(phase.redis.url)
    placed = [w.decode() for w in client.smembers(keys.placed_workers(MODEL))]
    streams = keys.jobs_streams(MODEL) + [s for w in placed for s in keys.worker_jobs_streams(MODEL, w)]
    jobs = 0
    for stream in streams:
        if client.exists(stream):
            jobs += sum(int(g["pending"]) + int(g.get("lag") or 0) for g in client.xinfo_groups(stream))
    running = 0
    for worker in client.zrange(keys.WORKERS_INDEX, 0, -1):
        running += int(float(client.hget(keys.worker_key(worker.decode()), "stat.active") or 0))
    return jobs, running


def run_phase(name: str, rtt_ms: float, args: argparse.Namespace, logdir: Path) -> Phase:
    """One phase, start to stop; prints its ledger summary."""
    phase = Phase(name, rtt_ms, args.workers, logdir)
    try:
        phase.start()  # inside: workers that never get ready must not leave Redis and the gateway running
        until = time.time() + args.duration
        threads = [threading.Thread(target=client_loop, args=(phase, until, args.seed + i)) for i in range(args.clients)]
        threads.append(threading.Thread(target=fault_loop, args=(phase, until, args.pause_s, args.seed)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=args.duration + CLIENT_TIMEOUT_S + 30)
        hung = sum(t.is_alive() for t in threads)
        leftover: tuple[int, int] = (-1, -1)
        deadline = time.time() + 30
        while time.time() < deadline and (leftover := leftover_work(phase)) != (0, 0):
            time.sleep(0.5)
        summarize(phase, hung, leftover)
    finally:
        phase.stop()
    return phase


def in_fault_window(entry: Entry, faults: list[list[float]]) -> bool:
    """Whether the request overlapped a fault or the recovery margin after it."""
    return any(entry.started <= end + FAULT_MARGIN_S and entry.ended >= start for start, end in faults)


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def summarize(phase: Phase, hung: int, leftover: tuple[int, int]) -> None:
    """Print the phase's ledger numbers and exactly-once checks."""
    entries = phase.entries
    server_ids = collections.Counter(e.server_id for e in entries if e.server_id)  # two answers under one id
    outcomes = collections.Counter(e.outcome for e in entries)
    reasons = collections.Counter(e.reason for e in entries if e.outcome == "failed")
    bad_finishes = [e for e in entries if e.kind == "chat-stream" and e.outcome == "completed"
                    and e.finishes != {0: 1}]
    unended = [e for e in entries if e.outcome not in ("completed", "cancelled", "failed")]
    clear = [e.ended - e.started for e in entries if e.outcome == "completed" and not in_fault_window(e, phase.faults)]
    failed_clear = [e for e in entries if e.outcome == "failed" and not in_fault_window(e, phase.faults)]
    phase.p99 = p99(clear)
    print(f"[{phase.name}] {len(entries)} requests: {dict(outcomes)}; failures by reason {dict(reasons)}")
    print(f"[{phase.name}] faults: {len(phase.faults) - 1} worker kills + 1 Redis pause; exactly once: "
          f"{sum(n > 1 for n in server_ids.values())} duplicate server ids, {len(unended)} without an outcome, "
          f"{len(bad_finishes)} streams with a choice finished != 1 time, {hung} clients hung; "
          f"left after the phase: {leftover[0]} jobs queued/held, {leftover[1]} sequences running; "
          f"{len(failed_clear)} failed outside the fault windows")
    if clear:
        print(f"[{phase.name}] completed outside fault windows: {len(clear)}, latency p50 "
              f"{statistics.median(clear) * 1000:.0f} ms, p99 {phase.p99 * 1000:.0f} ms")


def main() -> None:
    """Run the 0 ms phase and the --rtt-ms phase; write the ledger; print the p99 ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds per phase")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rtt-ms", type=float, default=1.0)
    parser.add_argument("--pause-s", type=float, default=10.0)  # the fault suite's SIGSTOP
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--ledger", type=Path, default=Path(tempfile.gettempdir()) / "llmfleet-soak.jsonl")
    args = parser.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="llmfleet-soak-"))
    print(f"soak: {args.clients} clients, {args.workers} workers, {args.duration:.0f} s per phase (logs: {logdir})")
    args.ledger.write_text("")
    phases = []
    for name, rtt_ms in (("0ms", 0.0), (f"{args.rtt_ms:g}ms", args.rtt_ms)):
        phases.append(run_phase(name, rtt_ms, args, logdir))
        with args.ledger.open("a") as out:  # each phase's entries as soon as it ends
            out.writelines(json.dumps(asdict(entry)) + "\n" for entry in phases[-1].entries)
    base, delayed = phases[0].p99, phases[1].p99
    print(f"p99 outside fault windows: {delayed * 1000:.0f} ms at {args.rtt_ms:g} ms RTT vs {base * 1000:.0f} ms at "
          f"0 ms: {delayed / base:.2f}x (target <= 1.3x); ledger {args.ledger}")


if __name__ == "__main__":
    main()
