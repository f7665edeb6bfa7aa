"""Batching benchmark (engine level, no Redis): aggregate decode tok/s by concurrency, and prefix-cache TTFT.

For each concurrency B the scheduler decodes B sequences together, and the float32 matmul ceiling at batch B
(the model's own matmul chain, no attention) is measured in the same run, so the ratios compare like with like.
Run: python bench/batching.py [--model smollm2-135m] [--sizes 1,4,16,32,64] [--steps 24]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import matmul_chain_rate  # noqa: E402

from worker.engine.decode.generation import GenerationParams  # noqa: E402
from worker.engine.decode.sampling import SamplingParams  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402
from worker.models import resolve  # noqa: E402
from worker.schedule.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from worker.schedule.sequences import GenerationRequest, SequenceStep  # noqa: E402


def scheduler_decode_rate(engine: Engine, batch: int, steps: int) -> float:
    """Aggregate tok/s of `batch` concurrent greedy requests, timed over decode steps only."""
    sched = Scheduler(engine, SchedulerConfig(max_sequences=max(batch, 1), prefix_cache=False, max_queue=batch))
    rng = np.random.default_rng(batch)
    params = GenerationParams(max_tokens=steps + 2, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    for i in range(batch):
        prompt = [int(t) for t in rng.integers(100, engine.model.config.vocab_size, 16)]
        sched.add(GenerationRequest(f"b{i}", prompt, params))
    sched.step()  # prefill all prompts (and sample the first tokens)
    start, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += sum(1 for e in sched.step() if isinstance(e, SequenceStep))
    return tokens / (time.perf_counter() - start)


def ttft(engine: Engine, sched: Scheduler, prompt: list[int], rid: str) -> float:
    """Seconds until the first token of one request."""
    params = GenerationParams(max_tokens=1, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    start = time.perf_counter()
    sched.add(GenerationRequest(rid, prompt, params))
    while sched.has_work:
        if any(isinstance(e, SequenceStep) for e in sched.step()):
            elapsed = time.perf_counter() - start
            while sched.has_work:
                sched.step()
            return elapsed
    raise RuntimeError("no token")


def main() -> None:
    """Print decode rates, ceilings and ratios per concurrency, then prefix-cache TTFT hit vs miss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", default="1,4,16,32,64")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    args = parser.parse_args()
    engine = Engine.load(resolve(args.model))
    scheduler_decode_rate(engine, 2, 2)  # warm-up
    rates: dict[int, float] = {}
    print(f"{'streams':>7} {'decode tok/s':>13} {'ceiling tok/s':>14} {'of ceiling':>10} {'vs 1 stream':>11}")
    for batch in (int(s) for s in args.sizes.split(",")):
        steps = args.steps if batch > 1 else 2 * args.steps
        rate = scheduler_decode_rate(engine, batch, steps)
        ceiling = matmul_chain_rate(engine.model.weights, batch, max(4, steps // 2))
        rates[batch] = rate
        base = rates.get(1, rate)
        print(f"{batch:>7} {rate:>13.1f} {ceiling:>14.1f} {rate / ceiling:>10.2f} {rate / base:>10.2f}x")

    rng = np.random.default_rng(7)
    prefix = [int(t) for t in rng.integers(100, engine.model.config.vocab_size, args.prefix_tokens)]
    sched = Scheduler(engine, SchedulerConfig())
    miss = ttft(engine, sched, prefix + [1000, 1001], "miss")
    hit = ttft(engine, sched, prefix + [1002, 1003], "hit")
    saved = sched.blocks.stats.tokens_hit
    print(f"TTFT with a {args.prefix_tokens}-token prefix: miss {miss * 1000:.0f} ms, hit {hit * 1000:.1f} ms "
          f"({miss / hit:.0f}x lower; {saved} tokens reused)")


if __name__ == "__main__":
    main()
