"""`llmfleet serve` memory and load time as a user runs it: per model, one round on a cold repack cache (a fresh
directory) and one on the warm cache it left, each a fresh `serve --workers N`. Reports, per round: seconds from
`serve` starting and from the last worker process starting to /ready counting N live workers; each worker's RSS,
PSS (/proc/PID/smaps_rollup) and peak RSS (VmHWM) after load and after R streamed greedy chat requests sent with
the official `openai` client (TTFT and decode tok/s of each); the repack file's size. Then the aims of issue 22:
PSS of all workers <= 1.2 x file + N x (KV budget + 400 MiB); warm worker start -> serving <= 3 s; cold
<= 10 s per GB of file. One process tree at a time; its children die with the benchmark.
Run: python bench/serve_memory.py --model PATH.gguf [--workers 2] [--kv-budget-mib 256] [--requests 3]
     [--max-tokens 16] [--repack-dir DIR (kept; default a temporary one)] [--rounds cold,warm]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from llmfleet.local_cluster import die_with_parent, http_json  # noqa: E402
from llmfleet.redis_server import free_port  # noqa: E402
from worker.models import model_id, resolve  # noqa: E402

MIB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")
WORKER_OVERHEAD_MIB = 400  # the allowance per worker beside its KV budget
FIELDS = ("Rss", "Pss", "Anonymous", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty")


def boot_clock() -> float:
    """Seconds since boot (the clock /proc/PID/stat's start times use)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def started_at(pid: int) -> float:
    """When process `pid` started, in seconds since boot."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / TICK  # field 22 (starttime); the split starts at field 3


def children(pid: int) -> list[int]:
    """Every descendant of `pid`."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(kids)
            frontier.extend(kids)
    return found


def worker_pids(serve_pid: int) -> list[int]:
    """The worker processes under a `serve` process (`llmfleet.cli worker` in their command line)."""
    pids = []
    for pid in children(serve_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"llmfleet.cli" in argv and b"worker" in argv:
            pids.append(pid)
    return sorted(pids)


def memory(pid: int) -> dict[str, float]:
    """A process's RSS, PSS, anonymous, private and shared pages and peak RSS (VmHWM), MiB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if parts and parts[0].rstrip(":") in FIELDS:
            values[parts[0].rstrip(":")] = int(parts[1]) / 1024
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            values["Peak"] = int(line.split()[1]) / 1024
    return values


@dataclass
class Round:
    """One serve start's measurements."""

    label: str
    serve_to_ready_s: float = 0.0
    worker_to_ready_s: float = 0.0
    after_load: list[dict[str, float]] = field(default_factory=list)
    after_requests: list[dict[str, float]] = field(default_factory=list)
    replies: list[tuple[int, float, float]] = field(default_factory=list)  # (tokens, TTFT s, decode tok/s)
    repack_mib: float = 0.0
    engine_load_s: list[float] = field(default_factory=list)  # each worker's own "loaded ... in X s" log line

    def total(self, key: str, when: str = "after_requests") -> float:
        """One field summed over the workers."""
        return sum(m.get(key, 0.0) for m in getattr(self, when))


def chat(base: str, model: str, index: int, max_tokens: int) -> tuple[int, float, float]:
    """One streamed greedy chat request through the official client (a completion where the model has no chat
    template): (completion tokens, TTFT, decode tok/s)."""
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", timeout=3600, max_retries=0)
    started = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    prompt = f"Request {index}: name three colours of the sea."
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True})
    except openai.BadRequestError as exc:  # a base model (Gemma 3 270M): no chat template, a completion instead
        if "chat template" not in str(exc):
            raise
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and _text(chunk.choices[0]):
            stamps.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if not stamps:
        raise RuntimeError(f"request {index}: no content came back")
    decode = (tokens - 1) / (stamps[-1] - stamps[0]) if tokens > 1 and stamps[-1] > stamps[0] else 0.0
    return tokens, stamps[0] - started, decode


def _text(choice: object) -> str:
    """A streamed choice's text: a chat delta's content or a completion's text."""
    delta = getattr(choice, "delta", None)
    return (delta.content or "") if delta is not None else (getattr(choice, "text", "") or "")


def start_serve(path: Path, workers: int, port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`llmfleet serve` in a session of its own, dying with this process."""
    argv = [sys.executable, "-m", "llmfleet.cli", "serve", "--model", str(path), "--workers", str(workers),
            "--port", str(port)]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=BENCH_DIR.parent,
                                start_new_session=True, preexec_fn=die_with_parent)


def stop_serve(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (serve drains), SIGKILL to the group after a minute."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_ready(proc: subprocess.Popen[bytes], url: str, workers: int, log: Path, timeout_s: float) -> float:
    """Poll /ready until it counts `workers` live workers; the boot-clock time it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        body = http_json(url + "/ready", timeout_s=5)
        if body.get("ready") and body.get("workers") == workers:
            return boot_clock()
        time.sleep(0.05)
    raise TimeoutError(f"not ready in {timeout_s:.0f}s:\n{log.read_text(errors='replace')[-3000:]}")


def run_round(label: str, path: Path, args: argparse.Namespace, repack_dir: Path, logdir: Path) -> Round:
    """Start serve, wait for it, measure, send the requests, measure again, stop it."""
    result = Round(label)
    port = free_port()
    env = dict(os.environ, LLMFLEET_REPACK_DIR=str(repack_dir), LLMFLEET_PORT=str(port))
    if args.kv_budget_mib:
        env["LLMFLEET_KV_BUDGET_MIB"] = str(args.kv_budget_mib)
    log = logdir / f"serve-{path.stem}-{label}.log"
    url = f"http://127.0.0.1:{port}"
    began = boot_clock()
    proc = start_serve(path, args.workers, port, env, log)
    try:
        ready = wait_ready(proc, url, args.workers, log, args.timeout_s)
        pids = worker_pids(proc.pid)
        result.serve_to_ready_s = ready - began
        result.worker_to_ready_s = ready - max(started_at(pid) for pid in pids)
        result.after_load = [memory(pid) for pid in pids]
        served = json.loads(_get(url + "/v1/models"))["data"]
        name = next((m["id"] for m in served if m["id"] == model_id(str(path))), served[0]["id"])
        result.replies = [chat(url + "/v1", name, i, args.max_tokens) for i in range(args.requests)]
        result.after_requests = [memory(pid) for pid in pids]
        result.engine_load_s = [float(s) for s in re.findall(rf"loaded {re.escape(path.name)} in ([0-9.]+)s",
                                                             log.read_text(errors="replace"))]
        result.repack_mib = sum(f.stat().st_size for f in repack_dir.glob(f"{path.name}.*.repack")) / MIB
    finally:
        stop_serve(proc)
    return result


def _get(url: str) -> str:
    """A GET's body."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def report(path: Path, args: argparse.Namespace, rounds: list[Round]) -> None:
    """Print one line per round and per worker, then the issue's aims against the numbers."""
    file_mib = path.stat().st_size / MIB
    print(f"== {path.name}: {file_mib:.0f} MiB file, serve --workers {args.workers}, KV budget "
          f"{args.kv_budget_mib or 'default'} MiB, {args.requests} chat requests of {args.max_tokens} tokens")
    for r in rounds:
        print(f"{r.label:5} serve->ready {r.serve_to_ready_s:6.1f} s  worker start->ready {r.worker_to_ready_s:6.1f} s  "
              f"(engine load {', '.join(f'{t:.1f}' for t in r.engine_load_s)} s)  repack file {r.repack_mib:.0f} MiB")
        for i, (load, served) in enumerate(zip(r.after_load, r.after_requests, strict=True)):
            print(f"      worker {i}: after load RSS {load['Rss']:6.0f} PSS {load['Pss']:6.0f}; after requests "
                  f"RSS {served['Rss']:6.0f} PSS {served['Pss']:6.0f} (anonymous {served['Anonymous']:.0f}, file pages "
                  f"{served['Rss'] - served['Anonymous']:.0f}) peak {served['Peak']:6.0f} MiB")
        for tokens, ttft, rate in r.replies:
            print(f"      reply: {tokens} tokens, TTFT {ttft:.2f} s, decode {rate:.2f} tok/s")
    aim = 1.2 * file_mib + args.workers * ((args.kv_budget_mib or 1024) + WORKER_OVERHEAD_MIB)
    for r in rounds:
        pss = r.total("Pss")
        print(f"aim {r.label}: PSS summed {pss:.0f} MiB vs <= {aim:.0f} MiB: {'met' if pss <= aim else 'MISSED'}")
        if r.label == "warm":
            print(f"aim warm: worker start->ready {r.worker_to_ready_s:.1f} s vs <= 3 s: "
                  f"{'met' if r.worker_to_ready_s <= 3 else 'MISSED'}")
        if r.label == "cold":
            per_gb = r.worker_to_ready_s / (path.stat().st_size / 1e9)
            print(f"aim cold: {per_gb:.1f} s per GB of file vs <= 10: {'met' if per_gb <= 10 else 'MISSED'}")
    print("(MiB; file pages: the mapped repack file, GGUF and libraries (page cache, reclaimable), which PSS splits "
          "between the processes that map them; anonymous: heap, KV pool; peak = VmHWM, file pages included)", flush=True)


def main() -> None:
    """Cold and warm rounds per model, printed with the aims."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="a pulled name or a .gguf path")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kv-budget-mib", type=float, default=256, help="0: serve's default")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", default="cold,warm", help="cold (empties the repack dir first), warm")
    parser.add_argument("--repack-dir", default=None, help="kept after the run (default: a temporary one)")
    parser.add_argument("--timeout-s", type=float, default=1800, help="for serve to become ready")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmfleet-servemem-") as tmp:
        repack_dir = Path(args.repack_dir or Path(tmp) / "repack")
        repack_dir.mkdir(parents=True, exist_ok=True)
        for model in args.model:
            path = resolve(model)
            rounds = []
            for label in args.rounds.split(","):
                if label == "cold":
                    for stale in repack_dir.glob(f"{path.name}.*"):
                        stale.unlink()
                rounds.append(run_round(label, path, args, repack_dir, Path(tmp)))
            report(path, args, rounds)


if __name__ == "__main__":
    main()
