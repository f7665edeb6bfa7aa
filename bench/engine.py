"""Engine benchmark: prefill and single-stream decode tok/s of each model against its matmul-chain ceiling.

The ceiling is measured in the same run: the same chain of matmuls (the engine's own `linear`) with the model's
own weights (q/k/v, output, gate/up, down, then the vocabulary projection), batch 1, no
attention, no norms, no sampling. Decode is also measured after a long prompt (--long-context), where
attention over the cache starts to count (Gemma 3's sliding layers read only their last 512 positions).
Run: python bench/engine.py [--model smollm2-135m --model gemma3-270m] [--decode-tokens 64] [--prompt-tokens 256]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from worker.engine.forward_batch import BatchEntry
from worker.engine.model import Model
from worker.engine.ops import linear, linear_parts
from worker.models import resolve


def matmul_chain_rate(weights: Any, batch: int, steps: int) -> float:
    """Tokens/s of the bare matmul chain of one forward step at the given batch size."""
    d = weights.token_embedding.shape[1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, d)).astype(np.float32)  # (B, D)
    attn = rng.standard_normal((batch, weights.layers[0].wo.shape[1])).astype(np.float32)  # (B, H*Dh)
    start = time.perf_counter()
    for _ in range(steps):
        for layer in weights.layers:
            _ = linear_parts(x, (layer.wq, layer.wk, layer.wv))  # (B, H*Dh + 2*Hkv*Dh)
            _ = linear(attn, layer.wo)  # (B, D)
            gate_up = linear_parts(x, (layer.w_gate, layer.w_up))  # (B, 2F)
            _ = linear(gate_up[:, : layer.w_down.shape[1]], layer.w_down)  # (B, D)
        _ = linear(x, weights.output)  # (B, V)
    return batch * steps / (time.perf_counter() - start)


def decode_rate(model: Model, batch: int, steps: int, prompt_tokens: int = 16) -> float:
    """Aggregate decode tokens/s of `batch` sequences stepping together (after a short prefill)."""
    rng = np.random.default_rng(1)
    pool = model.new_pool(batch * (prompt_tokens + steps + 64) * model.config.kv_bytes_per_token,
                          enable_prefix_caching=False)
    for i in range(batch):
        pool.ensure(i, prompt_tokens)
    model.forward([BatchEntry(i, rng.integers(0, model.config.vocab_size, prompt_tokens), 0)
                   for i in range(batch)], pool)
    next_tokens = rng.integers(0, model.config.vocab_size, batch)  # (B,)
    start = time.perf_counter()
    for step in range(steps):
        for i in range(batch):
            pool.extend(i, 1)
        logits = model.forward([BatchEntry(i, next_tokens[i : i + 1], prompt_tokens + step)
                                for i in range(batch)], pool)
        next_tokens = np.array([int(np.argmax(row)) for row in logits])  # (B,)
    return batch * steps / (time.perf_counter() - start)


def prefill_rate(model: Model, tokens: int) -> float:
    """Tokens/s of one prompt prefilled in a single forward."""
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, tokens)  # (T,)
    pool = model.new_pool((tokens + 64) * model.config.kv_bytes_per_token, enable_prefix_caching=False)
    pool.ensure(0, tokens)
    start = time.perf_counter()
    model.forward([BatchEntry(0, ids, 0)], pool)
    return tokens / (time.perf_counter() - start)


def measure(name: str, args: argparse.Namespace) -> dict[str, float]:
    """Every number of one model, decode and ceiling interleaved so background load hits both alike."""
    model = Model.from_file(resolve(name))
    decode_rate(model, 1, 4)  # warm up caches and BLAS threads
    prefill = max(prefill_rate(model, args.prompt_tokens) for _ in range(2))
    decodes, ceilings = [], []
    for _ in range(args.rounds):
        decodes.append(decode_rate(model, 1, args.decode_tokens))
        ceilings.append(matmul_chain_rate(model.weights, 1, args.decode_tokens))
    long_decode = decode_rate(model, 1, args.decode_tokens // 2, prompt_tokens=args.long_context)
    return {"MiB": model.weights.nbytes / 2**20, "prefill": prefill, "decode": float(np.median(decodes)),
            "decode_min": min(decodes), "decode_max": max(decodes), "ceiling": float(np.median(ceilings)),
            "long_decode": long_decode}


def main() -> None:
    """Print, per model: prefill tok/s, decode tok/s, the matmul ceiling, their ratio, decode at long context."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None, help="repeatable (default: smollm2-135m and "
                        "gemma3-270m)")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--long-context", type=int, default=2048, help="prompt tokens before the long decode row")
    parser.add_argument("--rounds", type=int, default=3, help="alternate decode and ceiling this many times")
    args = parser.parse_args()
    names = args.model or ["smollm2-135m", "gemma3-270m"]
    rows = {name: measure(name, args) for name in names}
    print(f"{'model':16} {'f32 MiB':>8} {'prefill':>9} {'decode (range)':>22} {'ceiling':>8} {'ratio':>6} "
          f"{'decode@' + str(args.long_context):>12}")
    for name, r in rows.items():
        spread = f"{r['decode']:.1f} ({r['decode_min']:.1f}-{r['decode_max']:.1f})"
        print(f"{name:16} {r['MiB']:8.0f} {r['prefill']:9.1f} {spread:>22} {r['ceiling']:8.1f} "
              f"{r['decode'] / r['ceiling']:6.2f} {r['long_decode']:12.1f}")
    print(f"(tok/s; prefill: one {args.prompt_tokens}-token forward; decode: batch 1, median of {args.rounds} x "
          f"{args.decode_tokens} steps; ceiling: the same matmul chain, batch 1, no attention)")


if __name__ == "__main__":
    main()
