"""What sampling a token costs, per row of a step, for this tree and a git revision, alternating in one run.

Logits are drawn peaked as a language model's are (Gaussian, plus twenty tokens 6-14 ahead), for two vocabulary
sizes (SmolLM2's 49,152 and Qwen3's 151,936) and 1, 16 and 64 rows, under three sets of controls: temperature
only (OpenAI's defaults: the unranked path), top_p 0.9 and top_k 40 (the ranked path); then flat rows with top_p
0.9, whose nucleus is most of the row (1 and 16 rows). The revision runs from a
temporary git worktree, in a subprocess with that tree first on sys.path.
Run: python bench/sampling.py [--ref b307fd4] [--rounds 2] (b307fd4: numpy's argpartition and cumsum)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/'s own modules, run as a script or from the tests
from revision_rounds import alternate  # noqa: E402

VOCABS = (49152, 151936)
ROWS = (1, 16, 64)
CONTROLS = {"T=1": {"temperature": 1.0}, "T=0.7 top_p=0.9": {"temperature": 0.7, "top_p": 0.9},
            "T=0.8 top_k=40": {"temperature": 0.8, "top_k": 40}}


def measure(repeats: int = 10) -> dict[str, float]:
    """Milliseconds per row of sample_batch, by 'vocab rows controls' (this process's tree)."""
    from worker.engine.decode.batch_sampling import sample_batch
    from worker.engine.decode.sampling import Sampler, SamplingParams

    rng = np.random.default_rng(0)
    result = {}
    for vocab in VOCABS:
        for rows in ROWS:
            logits = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)  # (B, V)
            for r in range(rows):
                logits[r, rng.integers(0, vocab, 20)] += rng.uniform(6, 14, 20).astype(np.float32)
            for name, controls in CONTROLS.items():
                samplers = [Sampler(SamplingParams(**controls), vocab) for _ in range(rows)]  # type: ignore[arg-type]
                history = [[1, 2, 3]] * rows
                sample_batch(samplers, logits, history, [[]] * rows)  # compiled and warm
                started = time.perf_counter()
                for _ in range(repeats):
                    sample_batch(samplers, logits, history, [[]] * rows)
                result[f"{vocab} {rows} {name}"] = (time.perf_counter() - started) / repeats / rows * 1e3
            if rows <= 16:  # flat rows (a high-entropy step, or a random-weight twin's): the nucleus is most of the row
                flat = (rng.standard_normal((rows, vocab)) * 0.5).astype(np.float32)  # (B, V)
                samplers = [Sampler(SamplingParams(temperature=0.7, top_p=0.9), vocab) for _ in range(rows)]
                sample_batch(samplers, flat, [[1, 2, 3]] * rows, [[]] * rows)
                started = time.perf_counter()
                for _ in range(repeats):
                    sample_batch(samplers, flat, [[1, 2, 3]] * rows, [[]] * rows)
                result[f"{vocab} {rows} flat, top_p=0.9"] = (time.perf_counter() - started) / repeats / rows * 1e3
    return result


def main() -> None:
    """Print ms per row for this tree and --ref, alternating rounds, with the ratio of their medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="b307fd4", help="git revision to compare with ('' = none)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(repeats=1)  # a pass to warm up: a fresh process's first 16-row steps paid for fresh pages (4x)
        print(json.dumps(measure()))
        return
    runs = alternate(__file__, [], args.ref, args.rounds)
    names = list(runs)
    print(f"sample_batch, ms per row (median of {args.rounds}; range); vocab, rows, controls")
    print(f"{'case':<28}" + "".join(f"{name:>24}" for name in names) + ("   ratio" if len(names) > 1 else ""))
    for case in runs[names[0]][0]:
        cells, medians = [], []
        for name in names:
            values = [run[case] for run in runs[name]]
            medians.append(float(np.median(values)))
            cells.append(f"{medians[-1]:.3f} ({min(values):.3f}-{max(values):.3f})")
        ratio = f"   {medians[0] / medians[1]:.2f}x" if len(names) > 1 else ""
        print(f"{case:<28}" + "".join(f"{c:>24}" for c in cells) + ratio)


if __name__ == "__main__":
    main()
