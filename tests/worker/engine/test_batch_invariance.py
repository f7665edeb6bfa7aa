"""Batch invariance on SmolLM2: a sequence's logits are bit-identical whatever else shares its step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from worker.engine.forward_batch import BatchEntry
from worker.engine.model import Model

pytestmark = pytest.mark.slow
DECODE_STEPS = 3


def _run(model: Model, prompts: list[list[int]], steps: int) -> list[list[np.ndarray]]:
    """Prefill every prompt in one step, then decode `steps` greedy tokens of all of them together."""
    pool = model.new_pool(96 << 20, enable_prefix_caching=False)
    for sid, prompt in enumerate(prompts):
        pool.ensure(sid, len(prompt))
    outs = model.forward([BatchEntry(sid, np.array(p), 0) for sid, p in enumerate(prompts)], pool)
    history = [[logits] for logits in outs]
    for _ in range(steps):
        entries = []
        for sid, logits in enumerate(outs):
            start = pool.blocks.num_tokens(sid)
            pool.extend(sid, 1)
            entries.append(BatchEntry(sid, np.array([int(np.argmax(logits))]), start))
        outs = model.forward(entries, pool)
        for sid, logits in enumerate(outs):
            history[sid].append(logits)
    return history


@pytest.mark.parametrize("batch", [2, 7, 64])
def test_a_prompt_alone_and_in_a_batch_of_others_gives_identical_logits(smollm2_engine: Any, batch: int) -> None:
    model: Model = smollm2_engine.model
    rng = np.random.default_rng(batch)
    prompt = smollm2_engine.encode_prompt("The capital of France is")
    others = [list(rng.integers(10, 40000, int(rng.integers(1, 40)))) for _ in range(batch - 1)]
    alone = _run(model, [prompt], DECODE_STEPS)[0]
    crowded = _run(model, others[: batch // 2] + [prompt] + others[batch // 2 :], DECODE_STEPS)[batch // 2]
    for step, (a, b) in enumerate(zip(alone, crowded)):
        assert np.array_equal(a, b), f"step {step}: largest difference {np.abs(a - b).max()}"


def test_chunked_prefill_gives_the_logits_of_one_piece(smollm2_engine: Any) -> None:
    model: Model = smollm2_engine.model
    prompt = smollm2_engine.encode_prompt("Write a long story about a dragon who learns to cook. " * 3)
    pool = model.new_pool(32 << 20, enable_prefix_caching=False)
    pool.ensure(0, len(prompt))
    whole = model.forward([BatchEntry(0, np.array(prompt), 0)], pool)[0]
    pool.ensure(1, len(prompt))
    for start in range(0, len(prompt), 16):
        chunked = model.forward([BatchEntry(1, np.array(prompt[start : start + 16]), start)], pool)[0]
    assert np.array_equal(whole, chunked), f"largest difference {np.abs(whole - chunked).max()}"
