"""Engine memory and load time: a fresh process loads a model, then reports its load time, resident and
proportional set size (RSS/PSS, /proc/self/smaps_rollup), peak RSS, decode tok/s at 1 and 8 streams and the
time of one prefill, and the CPU time a 1-stream decode step takes (less sensitive to other processes than wall
time, cleanest with --threads 1). Each checkout given (--repo, repeatable; default this one) runs in its own child process
with that checkout first on PYTHONPATH, alternating, so a baseline (e.g. --repo /work/main) is measured in the
same run. Run: python bench/engine_memory.py --model smollm2-135m [--model PATH.gguf] [--repo ../main] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
t0 = time.perf_counter()
from worker.engine.forward_batch import BatchEntry
from worker.engine.model import Model
from worker.models import resolve
name, prompt, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
path = name if name.endswith(".gguf") else resolve(name)
t1 = time.perf_counter()
model = Model.from_file(path)
load_s = time.perf_counter() - t1

def memory():
    fields = {}
    for line in open("/proc/self/smaps_rollup"):
        parts = line.split()
        if parts[0] in ("Rss:", "Pss:", "Private_Clean:", "Private_Dirty:", "Shared_Clean:"):
            fields[parts[0][:-1]] = int(parts[1]) / 1024
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            fields["Peak"] = int(line.split()[1]) / 1024
    return fields

after_load = memory()
rng = np.random.default_rng(1)

prefill_cpu = []  # CPU s per prefill (all threads)
cpu_ms = []  # CPU ms per decode step (all threads): less sensitive to other processes than wall time

def decode(batch):
    pool = model.new_pool(batch * (16 + steps + 64) * model.config.kv_bytes_per_token, enable_prefix_caching=False)
    for i in range(batch):
        pool.ensure(i, 16)
    model.forward([BatchEntry(i, rng.integers(0, model.config.vocab_size, 16), 0) for i in range(batch)], pool)
    tokens = rng.integers(0, model.config.vocab_size, batch)
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        for i in range(batch):
            pool.extend(i, 1)
        logits = model.forward([BatchEntry(i, tokens[i:i + 1], 16 + step) for i in range(batch)], pool)
        tokens = np.array([int(np.argmax(row)) for row in logits])
    if batch == 1:
        cpu_ms.append(1000 * (time.process_time() - cpu) / steps)
    return batch * steps / (time.perf_counter() - start)

def prefill():
    ids = rng.integers(0, model.config.vocab_size, prompt)
    pool = model.new_pool((prompt + 64) * model.config.kv_bytes_per_token, enable_prefix_caching=False)
    pool.ensure(0, prompt)
    start, cpu = time.perf_counter(), time.process_time()
    model.forward([BatchEntry(0, ids, 0)], pool)
    prefill_cpu.append(time.process_time() - cpu)
    return time.perf_counter() - start

decode(1)
result = {"load_s": load_s, **{k + "_after_load": v for k, v in after_load.items()},
          "decode1": max(decode(1) for _ in range(2)), "decode8": max(decode(8) for _ in range(2)),
          "prefill_s": min(prefill() for _ in range(2)), "cpu_ms1": min(cpu_ms),
          "prefill_cpu_s": min(prefill_cpu)}
result.update({k + "_after_steps": v for k, v in memory().items()})
print("RESULT " + json.dumps(result))
"""


def run_child(repo: Path, model: str, prompt: int, steps: int, threads: int | None) -> dict[str, float]:
    """One fresh process of one checkout: its measurements."""
    env = dict(os.environ, PYTHONPATH=str(repo))
    if threads:  # numba's and OpenBLAS's threads (CPU time per token is cleanest with one)
        env.update(NUMBA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", CHILD, model, str(prompt), str(steps)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{repo}: child failed\n{done.stderr[-3000:]}")


def main() -> None:
    """Print, per model and checkout: load s, RSS/PSS MiB after load and after steps, peak, decode, prefill."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None, help="a pulled name or a .gguf path")
    parser.add_argument("--repo", action="append", default=None, help="checkout to measure (repeatable)")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="numba and OpenBLAS threads (default: all cores)")
    args = parser.parse_args()
    repos = [Path(r).resolve() for r in (args.repo or [Path(__file__).resolve().parents[1]])]
    print(f"{'model':28} {'checkout':18} {'load s':>7} {'RSS':>6} {'PSS':>6} {'peak':>6} {'RSS run':>7} "
          f"{'dec1':>6} {'dec8':>6} {'prefill s':>9} {'cpu ms1':>7} {'pre cpu s':>9}")
    for model in args.model or ["smollm2-135m"]:
        for _ in range(args.rounds):
            for repo in repos:
                r = run_child(repo, model, args.prompt_tokens, args.decode_tokens, args.threads)
                print(f"{Path(model).name[:28]:28} {repo.name[:18]:18} {r['load_s']:7.2f} {r['Rss_after_load']:6.0f} "
                      f"{r['Pss_after_load']:6.0f} {r['Peak_after_steps']:6.0f} {r['Rss_after_steps']:7.0f} "
                      f"{r['decode1']:6.1f} {r['decode8']:6.1f} {r['prefill_s']:9.2f} {r['cpu_ms1']:7.0f} "
                      f"{r['prefill_cpu_s']:9.2f}", flush=True)
                time.sleep(1)
    print(f"(MiB; load: Model.from_file in a fresh process; decode: tok/s, best of 2 x {args.decode_tokens} steps; "
          f"prefill: one {args.prompt_tokens}-token forward, best of 2; cpu ms1 / pre cpu s: CPU time of all "
          f"threads per 1-stream step (best of 3) / per prefill (best of 2); wall-clock figures on a shared machine mostly show its load)")


if __name__ == "__main__":
    main()
