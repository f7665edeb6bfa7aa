"""Where a decode step goes: matmul / attention / other, at B streams, for this tree and a git revision.

The same script measures both trees in one run (the revision through a temporary git worktree, in a
subprocess with that tree first on sys.path), alternating, so background load hits both alike:
- step: wall time of a scheduler decode step with B greedy streams (no profiler);
- matmul: the step's matmul chain alone at batch B (the engine's own `linear` and weights, no attention);
- attention: the share of profiled step time spent in the attention functions (KV writes, gathers,
  scores, softmax, values), applied to the unprofiled step time;
- other: the rest (norms, RoPE, activations, embedding, sampling, detokenizing, scheduling).
Run: python bench/step_breakdown.py [--streams 32] [--prompt-tokens 16] [--ref fb9a5c4] [--rounds 3] [--model smollm2-135m]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")  # as the worker processes run (llmfleet/cli.py)

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/'s own modules, run as a script or from the tests
from revision_rounds import alternate  # noqa: E402

# the attention entry points (not nested in one another): ForwardBatch.attention now; attend and
# attend_decode_batch before (where the KV writes were inline in Model.forward, so "other" holds them)
ATTENTION_ENTRY_POINTS = ("attention", "attend", "attend_decode_batch")


def _scheduler(engine: Any, streams: int) -> Any:
    """A scheduler of this tree's or the older API, prefix caching off."""
    from worker.schedule.scheduler import Scheduler, SchedulerConfig

    try:
        config = SchedulerConfig(max_sequences=streams, max_queue=streams, prefix_cache=False)
    except TypeError:  # the older API
        config = SchedulerConfig(max_sequences=streams, max_queue=streams, prefix_cache_mib=0)
    return Scheduler(engine, config)


def measure(streams: int, steps: int, prompt_tokens: int = 16, model: str = "smollm2-135m") -> dict[str, float]:
    """Seconds per decode step: total, matmul, attention, other (this process's tree)."""
    sys.path.insert(0, str(Path.cwd() / "bench"))  # the measured tree's own bench/engine.py
    from engine import matmul_chain_rate

    from worker.engine.decode.generation import GenerationParams
    from worker.engine.decode.sampling import SamplingParams
    from worker.engine.engine import Engine
    from worker.models import resolve
    from worker.schedule.sequences import GenerationRequest
    engine = Engine.load(resolve(model))
    rng = np.random.default_rng(streams)
    warmup = -(-streams * prompt_tokens // 512) + 2  # steps until every prompt is prefilled (512-token prefill budget)
    params = GenerationParams(max_tokens=2 * steps + warmup + 4, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    sched = _scheduler(engine, streams)
    for i in range(streams):
        sched.add(GenerationRequest(f"b{i}", [int(t) for t in rng.integers(100, 40000, prompt_tokens)], params))
    for _ in range(warmup):  # prefill everything
        sched.step()
    start = time.perf_counter()
    for _ in range(steps):
        sched.step()
    step_s = (time.perf_counter() - start) / steps
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        sched.step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())  # tottime of everything
    attention = sum(row[3] for func, row in stats.stats.items() if func[2] in ATTENTION_ENTRY_POINTS)  # cumtime
    matmul_s = streams / matmul_chain_rate(engine.model.weights, streams, steps)
    attention_s = step_s * attention / total
    return {"step": step_s, "matmul": matmul_s, "attention": attention_s,
            "other": step_s - matmul_s - attention_s, "tok_s": streams / step_s}


def main() -> None:
    """Print the breakdown of this tree and of --ref, alternating rounds, with ranges."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--ref", default="fb9a5c4", help="git revision to compare with ('' = none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length: the context the steps attend to")
    parser.add_argument("--model", default="smollm2-135m", help="a model name or GGUF path (worker.models.resolve)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.streams, args.steps, args.prompt_tokens, args.model)))
        return
    results = alternate(__file__, ["--streams", str(args.streams), "--steps", str(args.steps), "--prompt-tokens",
                                   str(args.prompt_tokens), "--model", args.model], args.ref, args.rounds)
    print(f"decode step at {args.streams} streams, {args.prompt_tokens}-token prompts, ms (median of {args.rounds}; range)")
    print(f"{'tree':<16} {'step':>16} {'matmul':>16} {'attention':>16} {'other':>16} {'tok/s':>14}")
    for name, rows in results.items():
        cells = []
        for key in ("step", "matmul", "attention", "other", "tok_s"):
            values = [r[key] * (1 if key == "tok_s" else 1000) for r in rows]
            cells.append(f"{np.median(values):6.1f} ({min(values):.0f}-{max(values):.0f})")
        print(f"{name:<16} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
