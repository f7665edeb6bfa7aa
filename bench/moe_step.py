"""Where a mixture-of-experts decode step's time goes, in process (no server): for each step width N (N sequences
decoding one token each), the step's time and its parts: attention (the paged kernel, with the KV write), the dense
projections (qkv, o, the output), the router's matmul, routing (top k and weights), grouping (the pairs by
expert), the experts' grouped matmuls, the combine, and the rest (norms, RoPE, activation, Python).

    python bench/moe_step.py --model PATH [--widths 1,4,16,64] [--steps 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from worker.engine import experts, ops  # noqa: E402
from worker.engine.architectures import qwen3moe  # noqa: E402
from worker.engine.forward_batch import BatchEntry, ForwardBatch  # noqa: E402
from worker.engine.model import Model  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)


def timed(name: str, function: Callable[..., Any], classify: Callable[..., str] | None = None) -> Callable[..., Any]:
    """function, adding its wall time to SPENT[name] (or to the name `classify` gives its arguments)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT[classify(*args) if classify else name] += time.perf_counter() - start

    return wrapper


def instrument() -> None:
    """Wrap the step's parts (module attributes the architectures call through)."""
    ops.linear = timed("dense", ops.linear, lambda x, w: "router" if isinstance(w, np.ndarray) else "dense")
    ops.expert_linear = timed("experts", ops.expert_linear)
    experts._choose = timed("routing", experts._choose)
    qwen3moe.route = timed("route+group", qwen3moe.route)
    qwen3moe.combine = timed("combine", qwen3moe.combine)
    ForwardBatch.attention = timed("attention", ForwardBatch.attention)


def measure(model: Model, width: int, steps: int) -> tuple[float, dict[str, float]]:
    """Seconds per decode step of `width` sequences, and each part's share of it."""
    pool = model.new_pool(width * 64 * model.config.kv_bytes_per_token + (64 << 20), enable_prefix_caching=False)
    rng = np.random.default_rng(width)
    prompts = [rng.integers(100, 5000, 12) for _ in range(width)]
    for sid, prompt in enumerate(prompts):
        pool.ensure(sid, len(prompt))
    model.forward([BatchEntry(sid, p, 0) for sid, p in enumerate(prompts)], pool)
    lengths = [len(p) for p in prompts]
    total = 0.0
    SPENT.clear()
    for step in range(steps + 1):
        if step == 1:  # the first step warms caches: not counted
            SPENT.clear()
            total = 0.0
        for sid in range(width):
            pool.extend(sid, 1)
        entries = [BatchEntry(sid, np.array([7]), lengths[sid]) for sid in range(width)]
        start = time.perf_counter()
        model.forward(entries, pool)
        total += time.perf_counter() - start
        lengths = [n + 1 for n in lengths]
    parts = dict(SPENT)
    parts["route+group"] = parts.get("route+group", 0.0) - parts.get("routing", 0.0)  # grouping alone
    parts["rest"] = total - sum(parts.values())
    return total / steps, {name: value / total for name, value in parts.items()}


def main() -> None:
    """Load the model, time each width, print a row per width."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--widths", default="1,4,16,64")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    model = Model.from_file(args.model)
    instrument()
    print(f"{Path(args.model).name}: {model.config.n_layers} layers, {model.config.n_experts} experts, "
          f"{model.config.n_experts_used} used")
    for width in (int(w) for w in args.widths.split(",")):
        step, parts = measure(model, width, args.steps)
        shares = ", ".join(f"{name} {share:.0%}" for name, share in sorted(parts.items(), key=lambda kv: -kv[1]))
        print(f"N={width:3d}: {step * 1000:7.1f} ms/step, {width / step:6.1f} tok/s | {shares}")


if __name__ == "__main__":
    main()
