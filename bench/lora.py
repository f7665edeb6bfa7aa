"""Multi-LoRA benchmark (engine level, no Redis): 32 streams' decode tok/s with 1, 2, 4 and 8 adapters mixed in
the batch, against the base model alone, in the same run.

Adapters are random, written with gguf's GGUFWriter into a temp dir in the layout of llama.cpp's
convert_lora_to_gguf.py (rank --rank, every projection a llama block has: q, k, v, o, gate, up, down).
Streams are dealt to the adapters round robin, so every step's batch holds every adapter. The levels are
stepped in turn, one decode step each, so load from other processes falls on all of them alike; best of
--repeat rounds.
Run: python bench/lora.py [--model smollm2-135m] [--streams 32] [--counts 1,2,4,8] [--steps 16] [--rank 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.engine.decode.generation import GenerationParams  # noqa: E402
from worker.engine.decode.sampling import SamplingParams  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402
from worker.engine.lora import LoraAdapter  # noqa: E402
from worker.models import resolve  # noqa: E402
from worker.schedule.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from worker.schedule.sequences import GenerationRequest, SequenceStep  # noqa: E402


def write_random_adapter(path: Path, engine: Engine, rank: int, seed: int) -> Path:
    """A random LoRA GGUF for the engine's model: every block projection, float32, alpha = 2 * rank."""
    cfg = engine.model.config
    q, kv, d, f = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_model, cfg.d_ff
    shapes = {"attn_q": (q, d), "attn_k": (kv, d), "attn_v": (kv, d), "attn_output": (d, q),
              "ffn_gate": (f, d), "ffn_up": (f, d), "ffn_down": (d, f)}
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), cfg.architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(2 * rank))
    for layer in range(cfg.n_layers):
        for name, (out_dim, in_dim) in shapes.items():
            base = f"blk.{layer}.{name}.weight"
            writer.add_tensor(base + ".lora_a", (rng.standard_normal((rank, in_dim)) * 0.02).astype(np.float32))
            writer.add_tensor(base + ".lora_b", (rng.standard_normal((out_dim, rank)) * 0.02).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def start_streams(engine: Engine, streams: int, steps: int, adapters: list[LoraAdapter]) -> Scheduler:
    """A scheduler holding `streams` greedy requests, dealt round robin to `adapters` (none: base), prefilled."""
    sched = Scheduler(engine, SchedulerConfig(max_sequences=streams, prefix_cache=False, max_queue=streams,
                                              kv_budget_mib=64))
    rng = np.random.default_rng(streams)
    params = GenerationParams(max_tokens=steps + 2, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    for i in range(streams):
        prompt = [int(t) for t in rng.integers(100, engine.model.config.vocab_size, 16)]
        loras = ((adapters[i % len(adapters)], 1.0),) if adapters else ()
        sched.add(GenerationRequest(f"b{i}", prompt, params, loras=loras))
    sched.step()  # prefill all prompts (and sample the first tokens)
    return sched


def interleaved_rates(engine: Engine, streams: int, steps: int, levels: dict[int, list[LoraAdapter]]) -> dict[int, float]:
    """Decode tok/s of every level, stepping the levels in turn (one decode step each), so load from other
    processes falls on all of them alike."""
    scheds = {level: start_streams(engine, streams, steps, adapters) for level, adapters in levels.items()}
    seconds = dict.fromkeys(levels, 0.0)
    tokens = dict.fromkeys(levels, 0)
    for _ in range(steps):
        for level, sched in scheds.items():
            start = time.perf_counter()
            tokens[level] += sum(1 for e in sched.step() if isinstance(e, SequenceStep))
            seconds[level] += time.perf_counter() - start
    return {level: tokens[level] / seconds[level] for level in levels}


def main() -> None:
    """Print tok/s per adapter count and the ratio to the base model alone."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    engine = Engine.load(resolve(args.model))
    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        adapters = [engine.model.load_adapter(write_random_adapter(Path(tmp) / f"a{i}.gguf", engine, args.rank, i),
                                              f"a{i}") for i in range(max(counts))]
    interleaved_rates(engine, 4, 2, {0: [], 1: adapters[:1]})  # warm-up
    best: dict[int, float] = {}
    for _ in range(args.repeat):
        rates = interleaved_rates(engine, args.streams, args.steps, {c: adapters[:c] for c in [0, *counts]})
        best = {c: max(best.get(c, 0.0), r) for c, r in rates.items()}
    print(f"{args.streams} streams, rank {args.rank}, {args.steps} decode steps per level (levels stepped in "
          f"turn), best of {args.repeat}")
    print(f"{'adapters':>8} {'decode tok/s':>13} {'vs base':>8} {'step cost':>10}")
    for count in [0, *counts]:
        ratio = best[count] / best[0]
        print(f"{count or 'base':>8} {best[count]:>13.1f} {ratio:>8.2f} {1 / ratio - 1:>+10.1%}")


if __name__ == "__main__":
    main()
