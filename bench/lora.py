"""Multi-LoRA benchmark (engine level, no Redis): 32 streams' decode tok/s with 1, 2, 4 and 8 adapters mixed in
the batch, against the base model alone, in the same run.

Adapters are random, written with gguf's GGUFWriter into a temp dir in the layout of llama.cpp's
convert_lora_to_gguf.py (rank --rank, every projection a llama block has: q, k, v, o, gate, up, down).
Streams are dealt to the adapters round robin, so every step's batch holds every adapter. Each level is
measured --repeat times, interleaved with the others (best of), to ride out noise from other processes.
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

from worker.engine.engine import Engine  # noqa: E402
from worker.engine.generation import GenerationParams  # noqa: E402
from worker.engine.lora import LoraAdapter  # noqa: E402
from worker.engine.sampling import SamplingParams  # noqa: E402
from worker.models import resolve  # noqa: E402
from worker.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from worker.sequences import GenerationRequest, SequenceStep  # noqa: E402


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


def decode_rate(engine: Engine, streams: int, steps: int, adapters: list[LoraAdapter]) -> float:
    """Aggregate decode tok/s of `streams` greedy requests, dealt round robin to `adapters` (none: base)."""
    sched = Scheduler(engine, SchedulerConfig(max_sequences=streams, prefix_cache=False, max_queue=streams))
    rng = np.random.default_rng(streams)
    params = GenerationParams(max_tokens=steps + 2, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    for i in range(streams):
        prompt = [int(t) for t in rng.integers(100, engine.model.config.vocab_size, 16)]
        loras = ((adapters[i % len(adapters)], 1.0),) if adapters else ()
        sched.add(GenerationRequest(f"b{i}", prompt, params, loras=loras))
    sched.step()  # prefill all prompts (and sample the first tokens)
    start, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += sum(1 for e in sched.step() if isinstance(e, SequenceStep))
    return tokens / (time.perf_counter() - start)


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
    decode_rate(engine, 4, 2, adapters[:1])  # warm-up
    best: dict[int, float] = {}
    for _ in range(args.repeat):
        for count in [0, *counts]:
            rate = decode_rate(engine, args.streams, args.steps, adapters[:count])
            best[count] = max(best.get(count, 0.0), rate)
    print(f"{args.streams} streams, rank {args.rank}, {args.steps} decode steps, best of {args.repeat}")
    print(f"{'adapters':>8} {'decode tok/s':>13} {'vs base':>8} {'step cost':>10}")
    for count in [0, *counts]:
        ratio = best[count] / best[0]
        print(f"{count or 'base':>8} {best[count]:>13.1f} {ratio:>8.2f} {1 / ratio - 1:>+10.1%}")


if __name__ == "__main__":
    main()
