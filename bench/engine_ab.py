"""Engine A/B: resident memory, decode step time at 1/4/16/32 rows and a 256-token prefill, this tree against
another checkout (e.g. `git archive REV | tar -x -C /tmp/base`), interleaved round by round in fresh processes.

Each measurement runs in its own process (so resident memory is one engine's: VmRSS after load and after the
steps, VmHWM the peak); rounds alternate the trees, so background load hits both alike. Prints the best round.
Run: python bench/engine_ab.py --base /tmp/base [--model PATH] [--rounds 2] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
from worker.engine.forward_batch import BatchEntry
from worker.engine.model import Model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
path, steps = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
model = Model.from_file(path)
out = {"load_s": time.perf_counter() - start, "rss_load_mib": status("VmRSS")}
rng = np.random.default_rng(0)
for batch in (1, 4, 16, 32):
    pool = model.new_pool(batch * 160 * model.config.kv_bytes_per_token, enable_prefix_caching=False)
    for i in range(batch):
        pool.ensure(i, 16)
    model.forward([BatchEntry(i, rng.integers(0, 1000, 16), 0) for i in range(batch)], pool)
    times = []
    for step in range(steps + 1):
        for i in range(batch):
            pool.extend(i, 1)
        t = time.perf_counter()
        model.forward([BatchEntry(i, rng.integers(0, 1000, 1), 16 + step) for i in range(batch)], pool)
        times.append(time.perf_counter() - t)
    out[f"step_ms_{batch}"] = 1000 * min(times[1:])
pool = model.new_pool(300 * model.config.kv_bytes_per_token, enable_prefix_caching=False)
pool.ensure(0, 256)
t = time.perf_counter()
model.forward([BatchEntry(0, rng.integers(0, 1000, 256), 0)], pool)
out["prefill256_ms"] = 1000 * (time.perf_counter() - t)
out["rss_end_mib"] = status("VmRSS")
out["peak_mib"] = status("VmHWM")
print(json.dumps(out))
"""


def measure(tree: Path, model: str, steps: int) -> dict[str, float]:
    """One fresh process of one tree: its numbers."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", CHILD, model, str(steps)], cwd=tree, env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Alternate the trees for --rounds rounds; print each tree's best (lowest) figure per key."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path)
    parser.add_argument("--model", default=str(Path.home() / ".cache/llmfleet/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": Path(__file__).resolve().parents[1]}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            results[name].append(measure(tree, args.model, args.steps))
    keys = list(results["this"][0])
    print(f"{'':>16} {'base':>10} {'this':>10} {'this/base':>10}")
    for key in keys:
        base = min(r[key] for r in results["base"])
        this = min(r[key] for r in results["this"])
        print(f"{key:>16} {base:10.1f} {this:10.1f} {this / base:10.2f}")


if __name__ == "__main__":
    main()
