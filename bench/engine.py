"""Engine benchmark: SmolLM2 prefill and single-stream decode tok/s against the float32 matmul ceiling.

The ceiling is measured in the same run: the same chain of matmuls (the engine's own `linear`) with the model's
own weight arrays (fused QKV, output, fused gate/up, down, then the vocabulary projection), batch 1, no
attention, no norms, no sampling.
Run: python bench/engine.py [--model smollm2-135m] [--decode-tokens 64] [--prompt-tokens 256]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from worker.engine.architectures.llama import LlamaWeights
from worker.engine.forward_batch import BatchEntry
from worker.engine.model import Model
from worker.engine.ops import linear
from worker.models import resolve


def matmul_chain_rate(weights: LlamaWeights, batch: int, steps: int) -> float:
    """Tokens/s of the bare matmul chain of one forward step at the given batch size."""
    d = weights.token_embedding.shape[1]
    x = np.random.default_rng(0).standard_normal((batch, d)).astype(np.float32)  # (B, D)
    start = time.perf_counter()
    for _ in range(steps):
        for layer in weights.layers:
            _ = linear(x, layer.wqkv)  # (B, H*Dh + 2*Hkv*Dh)
            _ = linear(x, layer.wo)  # (B, D)
            gate_up = linear(x, layer.w_gate_up)  # (B, 2F)
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


def main() -> None:
    """Print prefill tok/s, decode tok/s, the matmul ceiling and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="alternate decode and ceiling this many times")
    args = parser.parse_args()
    model = Model.from_file(resolve(args.model))
    decode_rate(model, 1, 4)  # warm up caches and BLAS threads
    prefill = max(prefill_rate(model, args.prompt_tokens) for _ in range(2))
    decodes, ceilings = [], []
    for _ in range(args.rounds):  # interleave so background load hits both alike
        decodes.append(decode_rate(model, 1, args.decode_tokens))
        ceilings.append(matmul_chain_rate(model.weights, 1, args.decode_tokens))
    decode, ceiling = float(np.median(decodes)), float(np.median(ceilings))
    print(f"model            {args.model}  ({model.weights.nbytes / 2**20:.0f} MiB float32)")
    print(f"prefill          {prefill:8.1f} tok/s  ({args.prompt_tokens}-token prompt, one forward)")
    print(f"decode (batch 1) {decode:8.1f} tok/s  (median of {args.rounds} x {args.decode_tokens} steps)")
    print(f"f32 ceiling      {ceiling:8.1f} tok/s  (same matmul chain, batch 1, no attention)")
    print(f"decode/ceiling   {decode / ceiling:8.2f}")


if __name__ == "__main__":
    main()
