"""A quantized twin's accuracy against its own F16 file: ours beside llama.cpp's, teacher-forced.

The truth is llama.cpp's llama-server on the twin's F16 file with a float32 KV cache (5 prompts, 20 with
`--prompts 20`; 32 greedy steps each). Both engines then run the quantized file (e.g. Q4_K_M, made from that F16 by llama-quantize) teacher-forced
on the truth's tokens, one decode step at a time after the prompt, as a server decodes: at every step the largest
|log-probability - truth| over the truth's top-20 tokens, each engine seen as llama-server gives its step: its 160
largest log-probabilities, a truth token outside them counted at the list's lowest (both engines alike: a full
vector against a clipped list would favour the list). Printed for each engine: the maximum over all steps and
the mean over steps of each step's largest error. llmfleet passes where both of its figures are no larger than
llama.cpp's (the accuracy budget of ../shared/fixtures/quantized/README.md, in log-probabilities).

    python bench/twin_accuracy.py --family llama3 --shape 1b [--type Q4_K_M] [--seed 1] [--prompts 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.llama_oracle import LlamaServer  # noqa: E402
from bench.synthetic_model import FAMILIES, default_tokenizer_source, make_twin  # noqa: E402
from worker.engine.formats.gguf_file import read_metadata  # noqa: E402
from worker.engine.forward_batch import BatchEntry  # noqa: E402
from worker.engine.model import Model  # noqa: E402
from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf  # noqa: E402

PROMPTS = ("The capital of France is", "def fibonacci(n):\n    return", "Once upon a time, in a land far away,",
           "Les données 2026: 12,345 résultats — ok?", "Write a haiku about spreadsheets and the sea.")
MORE_PROMPTS = ("SELECT name, count(*) FROM orders GROUP BY", "The mitochondria is the", "import numpy as np\nx =",
                "Dear hiring manager, I am writing to", "1, 1, 2, 3, 5, 8, 13,", "In 1969, the first person to walk on",
                "Q: What is the boiling point of water?\nA:", "<html><body><h1>", "Ingredients: 2 cups of flour,",
                "The quick brown fox jumps over", "Translate to German: good morning ->", "Error: segmentation fault at",
                "Step 1: open the terminal. Step 2:", "Il était une fois un petit", "The derivative of x^2 is")
STEPS, TOP = 32, 20
LISTED = TOP * 8  # the log-probabilities each engine's step lists: llama-server gives no more than it is asked for
TWINS = Path.home() / ".cache/llmfleet-peers/twins"


@dataclass(frozen=True)
class Truth:
    """The truth run of one prompt: its ids, the greedy continuation, and each step's top-20 log-probabilities."""

    prompt: list[int]
    tokens: list[int]
    top: list[dict[int, float] | None]  # None: a step llama-server gave no probabilities for (skipped)


@dataclass(frozen=True)
class Errors:
    """An engine's error over all steps: the largest, and the mean of each step's largest."""

    worst: float
    mean: float


def twin_file(family: str, shape: str, kind: str, source: Path, seed: int = 0) -> Path:
    """The twin of weight seed `seed` in ~/.cache/llmfleet-peers/twins, made on first use (the same bytes every
    time)."""
    TWINS.mkdir(parents=True, exist_ok=True)
    path = TWINS / (f"{family}-{shape}-{kind}.gguf" if seed == 0 else f"{family}-{shape}-seed{seed}-{kind}.gguf")
    return path if path.exists() else make_twin(family, shape, seed, kind, path, source)


def truth_runs(f16: Path, prompts: list[list[int]], steps: int = STEPS) -> list[Truth]:
    """llama-server on the F16 file, float32 KV cache: greedy tokens and their top-20 log-probabilities."""
    with LlamaServer(f16, "-ctk", "f32", "-ctv", "f32") as server:
        runs = [server.greedy(ids, steps, TOP) for ids in prompts]
    return [Truth(ids, [token for token, _ in run], [top for _, top in run]) for ids, run in zip(prompts, runs)]


Step = tuple[int, int]  # (prompt, step)


def llama_cpp_logprobs(quantized: Path, truths: list[Truth]) -> dict[Step, dict[int, float]]:
    """llama-server on the quantized file, teacher-forced on the truth's tokens one step at a time: each step's
    top log-probabilities (steps it gave none for are left out)."""
    found: dict[Step, dict[int, float]] = {}
    with LlamaServer(quantized) as server:
        for n, truth in enumerate(truths):
            ids = list(truth.prompt)
            for step, top in enumerate(truth.top):
                got = server.next_logprobs(ids, LISTED) if top is not None else None
                ids.append(truth.tokens[step])
                if top is not None and got is not None:
                    found[(n, step)] = got
    return found


def engine_logprobs(quantized: Path, truths: list[Truth], served: bool) -> dict[Step, np.ndarray]:
    """Our engine on the quantized file, teacher-forced one step at a time: each step's log-probabilities (V,).
    served: the integer kernels and the float16 pool; else the file's exact arithmetic (every weight dequantized
    to float32, a float32 pool)."""
    model = Model.from_file(quantized, block_codes=served)
    found: dict[Step, np.ndarray] = {}
    for n, truth in enumerate(truths):
        pool = model.new_pool(64 << 20, enable_prefix_caching=False, dtype="float16" if served else "float32")
        pool.ensure(0, len(truth.prompt))
        logits = model.forward([BatchEntry(0, np.array(truth.prompt), 0)], pool)[0]  # (V,)
        for step in range(len(truth.tokens)):
            shifted = np.asarray(logits, np.float64) - float(np.max(logits))  # (V,)
            found[(n, step)] = shifted - np.log(np.exp(shifted).sum())  # (V,)
            start = pool.blocks.num_tokens(0)
            pool.extend(0, 1)
            logits = model.forward([BatchEntry(0, np.array([truth.tokens[step]]), start)], pool)[0]  # (V,)
        pool.blocks.free(0)
    return found


def errors(steps: list[Step], reference: dict[Step, dict[int, float]], candidate: dict[Step, Any]) -> Errors:
    """At each step the largest |candidate - reference| over the reference's tokens (a token missing from a
    candidate's top list counts at that list's lowest log-probability); the max and the mean over steps."""
    per_step = [max(abs(_logprob(candidate[key], i) - lp) for i, lp in reference[key].items()) for key in steps]
    return Errors(max(per_step), float(np.mean(per_step)))


def _logprob(candidate: dict[int, float] | np.ndarray, token: int) -> float:
    """A token's log-probability in a full (V,) vector, or in a top list (its lowest value when absent)."""
    if isinstance(candidate, dict):
        return candidate.get(token, min(candidate.values()))
    return float(candidate[token])


def top_of(logprobs: np.ndarray, count: int = TOP) -> dict[int, float]:
    """The `count` largest log-probabilities of a (V,) vector by token id."""
    ids = np.argsort(-logprobs)[:count]  # (count,)
    return {int(i): float(logprobs[i]) for i in ids}


def main() -> None:
    """Make the twins (once), run the truth and both engines, print the table row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--shape", required=True)
    parser.add_argument("--type", default="Q4_K_M")
    parser.add_argument("--seed", type=int, default=0, help="the twin's weights (each seed is another draw of noise)")
    every = PROMPTS + MORE_PROMPTS
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=(len(PROMPTS), len(every)),
                        help="5: PROMPTS; 20: MORE_PROMPTS beside them")
    args = parser.parse_args()
    source = default_tokenizer_source()
    started = time.monotonic()
    f16 = twin_file(args.family, args.shape, "F16", source, args.seed)
    quantized = twin_file(args.family, args.shape, args.type, source, args.seed)
    tokenizer = tokenizer_from_gguf(read_metadata(f16), source=str(f16))
    prompts = [tokenizer.encode(text, parse_special=False, add_bos=False) for text in every[: args.prompts]]
    truths = truth_runs(f16, prompts)
    theirs = llama_cpp_logprobs(quantized, truths)
    # ours as llama-server's are seen: its LISTED largest, a truth token outside them at the list's lowest value (a
    # full vector against a clipped list favoured the list: on a 248,320-token twin the truth's top tokens often
    # fall outside the quantized model's top 160, and a clipped value is never further than the real one)
    ours = {key: top_of(row, LISTED) for key, row in engine_logprobs(quantized, truths, served=True).items()}
    exact_listed = {key: top_of(row, LISTED) for key, row in engine_logprobs(quantized, truths, served=False).items()}
    exact = {key: dict(list(top.items())[:TOP]) for key, top in exact_listed.items()}  # its top-20, largest first
    steps = sorted(theirs)
    f16_truth = {(n, step): top for n, truth in enumerate(truths) for step, top in enumerate(truth.top) if top}
    print(f"{args.family} {args.shape} {args.type} ({quantized.stat().st_size / 1e9:.2f} GB): {len(steps)} teacher-"
          f"forced steps ({len(truths)} prompts x {STEPS}, less those llama-server gave no probabilities for), "
          f"top-{TOP} log-prob error, max / mean over steps ({time.monotonic() - started:.0f} s)")
    for name, reference in (("vs the F16 file (llama.cpp, float32 KV)", f16_truth),
                            ("vs the quantized file's exact arithmetic (float32)", exact)):
        a, b = errors(steps, reference, theirs), errors(steps, reference, ours)
        verdict = "ok" if b.worst <= a.worst and b.mean <= a.mean else "OVER llama.cpp's"
        print(f"  {name}: llama.cpp {a.worst:.4f} / {a.mean:.4f}, llmfleet {b.worst:.4f} / {b.mean:.4f}: {verdict}")
        if reference is f16_truth:  # the floor: the quantized weights' own error, no rounding of either engine's
            floor = errors(steps, reference, exact_listed)
            print(f"    (the quantized file's exact arithmetic, read the same way: {floor.worst:.4f} / {floor.mean:.4f})")
        for n in range(len(truths)):  # each prompt apart: how much of a difference one prompt's run makes
            own = [key for key in steps if key[0] == n]
            if own:
                a, b = errors(own, reference, theirs), errors(own, reference, ours)
                print(f"    prompt {n}: llama.cpp {a.worst:.4f} / {a.mean:.4f}, llmfleet {b.worst:.4f} / {b.mean:.4f}")


if __name__ == "__main__":
    main()
