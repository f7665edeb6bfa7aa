"""The batched forward pass over the KV pool: caching, batching and chunking never change the numbers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from worker.engine.errors import ContextLengthError
from worker.engine.forward_batch import BatchEntry, OutputKind
from worker.engine.kernels.simd_int import int_path
from worker.engine.kv.pool import KVPool
from worker.engine.model import Model


def _tokens(model: Model, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, n)  # (n,)


def _pool(model: Model, n_blocks: int = 96, block_size: int = 8) -> KVPool:
    return KVPool(model.config, n_blocks, block_size, enable_prefix_caching=False)


def _entry(pool: KVPool, seq_id: int, tokens: np.ndarray, output: OutputKind = "last") -> BatchEntry:
    """Append tokens to sequence seq_id (creating its table on first use)."""
    start = pool.blocks.num_tokens(seq_id) if pool.blocks.has(seq_id) else 0
    pool.ensure(seq_id, start + len(tokens))
    return BatchEntry(seq_id, tokens, start, output)


def _alone(model: Model, tokens: np.ndarray, output: OutputKind = "last") -> np.ndarray:
    pool = _pool(model)
    return model.forward([_entry(pool, 0, tokens, output)], pool)[0]


def test_incremental_decode_with_cache_equals_full_forward(tiny_model: Model) -> None:
    tokens = _tokens(tiny_model, 40, 1)
    full = _alone(tiny_model, tokens, "all")  # (T, V)
    pool = _pool(tiny_model)
    stepwise = [tiny_model.forward([_entry(pool, 0, tokens[:10])], pool)[0]]
    for t in range(10, len(tokens)):
        stepwise.append(tiny_model.forward([_entry(pool, 0, tokens[t : t + 1])], pool)[0])
    np.testing.assert_allclose(np.stack(stepwise), full[9:], rtol=1e-4, atol=1e-4)
    assert pool.blocks.num_tokens(0) == len(tokens)


def test_sequence_in_a_batch_equals_alone(tiny_model: Model) -> None:
    prompts = [_tokens(tiny_model, n, seed) for n, seed in [(7, 2), (23, 3), (1, 4), (15, 5)]]
    alone = [_alone(tiny_model, p, "all") for p in prompts]
    pool = _pool(tiny_model)
    together = tiny_model.forward([_entry(pool, i, p, "all") for i, p in enumerate(prompts)], pool)
    for a, b in zip(alone, together):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # then decode steps for all of them together (different lengths: padded, masked), mixed with a prefill
    extra = _tokens(tiny_model, 5, 6)
    nxt = [np.array([int(a[-1].argmax())]) for a in alone]
    for _ in range(3):
        mixed = tiny_model.forward([_entry(pool, i, t) for i, t in enumerate(nxt)] + [_entry(pool, 9, extra)], pool)
        for i, (p, t, got) in enumerate(zip(prompts, nxt, mixed)):
            prompts[i] = np.concatenate([p, t])
            np.testing.assert_allclose(got, _alone(tiny_model, prompts[i]), rtol=1e-4, atol=1e-4)
        nxt = [np.array([int(m.argmax())]) for m in mixed[:-1]]
        extra = nxt[0]


def test_chunked_prefill_equals_one_piece(tiny_model: Model) -> None:
    tokens = _tokens(tiny_model, 100, 7)
    whole = _alone(tiny_model, tokens)
    pool = _pool(tiny_model)
    for start in range(0, 100, 32):
        last = tiny_model.forward([_entry(pool, 0, tokens[start : start + 32])], pool)[0]
    np.testing.assert_allclose(last, whole, rtol=1e-4, atol=1e-4)


def test_output_kinds(tiny_model: Model) -> None:
    tokens = _tokens(tiny_model, 6, 8)
    pool = _pool(tiny_model)
    outs = tiny_model.forward([_entry(pool, 0, tokens, "hidden"), _entry(pool, 1, tokens, "none"),
                               _entry(pool, 2, tokens, "all")], pool)
    assert outs[0].shape == (6, tiny_model.config.d_model)
    assert outs[1] is None
    assert outs[2].shape == (6, tiny_model.config.vocab_size)


def test_context_overflow_is_refused(tiny_model: Model) -> None:
    n = tiny_model.config.context_length + 1
    pool = _pool(tiny_model, n_blocks=n // 8 + 2)
    with pytest.raises(ContextLengthError):
        tiny_model.forward([_entry(pool, 0, _tokens(tiny_model, n, 9))], pool)


def test_a_sequence_without_slots_is_refused(tiny_model: Model) -> None:
    pool = _pool(tiny_model)
    pool.ensure(0, 4)
    with pytest.raises(ValueError, match="no KV slots"):
        tiny_model.forward([BatchEntry(0, _tokens(tiny_model, 6, 10), 0)], pool)


def test_a_float32_pool_takes_twice_the_bytes_per_block_and_gives_the_same_logits(smollm2_engine: Any) -> None:
    """The pool dtype (LLMFLEET_KV_DTYPE): float16 halves a block; logits stay within float16 rounding."""
    model = smollm2_engine.model
    budget = 6 * KVPool.bytes_per_block(model.config, dtype=np.float32)
    half, single = model.new_pool(budget), model.new_pool(budget, dtype="float32")
    assert single.block_bytes == 2 * half.block_bytes and half.n_blocks == 2 * single.n_blocks
    assert half.keys[0].dtype == np.float16 and single.keys[0].dtype == np.float32
    prompt = np.array(smollm2_engine.encode_prompt("The capital of France is"))
    outputs = []
    for pool in (half, single):
        pool.ensure(0, len(prompt))
        logits = model.forward([BatchEntry(0, prompt, 0)], pool)[0]
        pool.extend(0, 1)
        outputs.append(model.forward([BatchEntry(0, np.array([int(np.argmax(logits))]), len(prompt))], pool)[0])
    np.testing.assert_allclose(outputs[0], outputs[1], atol=0.05)
    with pytest.raises(ValueError, match="float16, float32"):
        model.new_pool(8 << 20, dtype="int8")


def test_the_integer_path_is_logged_at_load(tiny_gguf_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="worker.engine.model"):
        Model.from_file(tiny_gguf_path)
    assert f"integer kernels: {int_path()} path" in caplog.text
