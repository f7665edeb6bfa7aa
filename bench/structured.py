"""Structured-output benchmark (engine level, no Redis): decode tok/s with every row held to a JSON schema by its
own llguidance matcher, against the same rows unconstrained, in the same run.

Both sides sample the same way, so the difference is the per-row mask (computed by the matcher, applied to
the scores) and the matcher's advance on each token; the time spent in those is clocked too (the last column),
which is the robust figure on a machine that others share. Two samplers: greedy (the unconstrained side takes the
raw argmax, the cheapest path there is) and temperature 0.7 with top_p 0.95. The schema (an array of at
least 64 small objects) keeps every row decoding for the whole measurement.
Run: python bench/structured.py [--model smollm2-135m] [--sizes 1,32] [--steps 24] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.engine.decode.generation import GenerationParams  # noqa: E402
from worker.engine.decode.sampling import SamplingParams  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402
from worker.engine.text.constraints import Constraint, SequenceConstraint  # noqa: E402
from worker.models import resolve  # noqa: E402
from worker.schedule.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from worker.schedule.sequences import GenerationRequest, RequestFailed, SequenceStep  # noqa: E402

SCHEMA = {"type": "array", "minItems": 64, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                     "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}}


SAMPLERS = {"greedy": SamplingParams(temperature=0.0), "t0.7 p0.95": SamplingParams(temperature=0.7, top_p=0.95)}


class ConstraintClock:
    """Seconds spent in every sequence's mask (SequenceConstraint.__call__) and advance, while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._originals = {name: getattr(SequenceConstraint, name) for name in ("__call__", "advance")}

    def __enter__(self) -> ConstraintClock:
        for name, original in self._originals.items():
            setattr(SequenceConstraint, name, self._timed(original))
        return self

    def __exit__(self, *_: object) -> None:
        for name, original in self._originals.items():
            setattr(SequenceConstraint, name, original)

    def _timed(self, method):  # noqa: ANN001, ANN202
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def decode_rate(engine: Engine, batch: int, steps: int, constrained: bool, sampling: SamplingParams
                ) -> tuple[float, float, float]:
    """Aggregate tok/s of `batch` concurrent requests over decode steps only, the mean step in ms, and the
    ms per step spent masking and advancing matchers."""
    sched = Scheduler(engine, SchedulerConfig(max_sequences=batch, prefix_cache=False, max_queue=batch,
                                              speculative_tokens=0))
    rng = np.random.default_rng(batch)
    constraint = Constraint("json_schema", json.dumps(SCHEMA)) if constrained else None
    prompt_head = engine.encode_chat([{"role": "user", "content": "List 64 people with their ages as JSON."}])
    for i in range(batch):
        params = GenerationParams(max_tokens=steps + 8, sampling=replace(sampling, seed=i),
                                  ignore_eos=True, constraint=constraint)
        tail = [int(t) for t in rng.integers(100, 1000, 4)]  # prompts differ a little, as real ones do
        sched.add(GenerationRequest(f"b{i}", prompt_head + tail, params))
    sched.step()  # prefill every prompt (and sample the first tokens)
    start, tokens = time.perf_counter(), 0
    with ConstraintClock() as clock:
        for _ in range(steps):
            events = sched.step()
            if any(isinstance(e, RequestFailed) for e in events):
                raise RuntimeError("a request failed")
            tokens += sum(1 for e in events if isinstance(e, SequenceStep))
    elapsed = time.perf_counter() - start
    return tokens / elapsed, elapsed / steps * 1000, clock.seconds / steps * 1000


def main() -> None:
    """Print decode rates constrained and not, per concurrency, with the slowdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", default="1,32")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per case; the best is kept")
    parser.add_argument("--threads", type=int, default=0, help="BLAS threads (0: all cores; 1 is steadier on a "
                                                               "machine that others share)")
    args = parser.parse_args()
    if args.threads:
        threadpool_limits(limits=args.threads, user_api="blas")
    engine = Engine.load(resolve(args.model))
    decode_rate(engine, 2, 2, True, SAMPLERS["greedy"])  # warm-up (and the llguidance tokenizer, built once)
    print(f"{'sampler':>10} {'streams':>7} {'free tok/s':>11} {'json tok/s':>11} {'slower':>7} "
          f"{'json ms/step':>13} {'of it: masks':>13}")
    for name, sampling in SAMPLERS.items():
        for batch in (int(s) for s in args.sizes.split(",")):
            steps = args.steps if batch > 1 else 2 * args.steps
            best = {False: (0.0, 0.0, 0.0), True: (0.0, 0.0, 0.0)}
            for _ in range(args.repeats):  # alternate, so both sides see the same machine
                for constrained in (False, True):
                    rate = decode_rate(engine, batch, steps, constrained, sampling)
                    best[constrained] = max(best[constrained], rate)
            free, (json_rate, json_ms, mask_ms) = best[False][0], best[True]
            print(f"{name:>10} {batch:>7} {free:>11.1f} {json_rate:>11.1f} {(1 - json_rate / free) * 100:>6.1f}% "
                  f"{json_ms:>13.1f} {mask_ms:>8.2f} ms ({mask_ms / json_ms * 100:.1f}%)")


if __name__ == "__main__":
    main()
