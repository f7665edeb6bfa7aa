"""The batched forward pass: caching, batching and chunking never change the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine.errors import ContextLengthError
from worker.engine.model import BatchEntry, Model


def _tokens(model: Model, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, n)  # (n,)


def test_incremental_decode_with_cache_equals_full_forward(tiny_model: Model) -> None:
    tokens = _tokens(tiny_model, 40, 1)
    full = tiny_model.forward([BatchEntry(tokens, tiny_model.new_cache(), output="all")])[0]  # (T, V)
    cache = tiny_model.new_cache()
    stepwise = [tiny_model.forward([BatchEntry(tokens[:10], cache)])[0]]
    for t in range(10, len(tokens)):
        stepwise.append(tiny_model.forward([BatchEntry(tokens[t : t + 1], cache)])[0])
    np.testing.assert_allclose(np.stack(stepwise), full[9:], rtol=1e-4, atol=1e-4)
    assert cache.length == len(tokens)


def test_sequence_in_a_batch_equals_alone(tiny_model: Model) -> None:
    prompts = [_tokens(tiny_model, n, seed) for n, seed in [(7, 2), (23, 3), (1, 4), (15, 5)]]
    alone = [tiny_model.forward([BatchEntry(p, tiny_model.new_cache(), output="all")])[0] for p in prompts]
    caches = [tiny_model.new_cache() for _ in prompts]
    together = tiny_model.forward([BatchEntry(p, c, output="all") for p, c in zip(prompts, caches)])
    for a, b in zip(alone, together):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # then one decode step for all of them together, mixed with a fresh prefill
    extra = _tokens(tiny_model, 5, 6)
    nxt = [np.array([int(a[-1].argmax())]) for a in alone]
    mixed = tiny_model.forward([BatchEntry(t, c) for t, c in zip(nxt, caches)] + [BatchEntry(extra, tiny_model.new_cache())])
    for p, t, got in zip(prompts, nxt, mixed):
        want = tiny_model.forward([BatchEntry(np.concatenate([p, t]), tiny_model.new_cache())])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_chunked_prefill_equals_one_piece(tiny_model: Model) -> None:
    tokens = _tokens(tiny_model, 100, 7)
    whole = tiny_model.forward([BatchEntry(tokens, tiny_model.new_cache())])[0]
    cache = tiny_model.new_cache()
    for start in range(0, 100, 32):
        last = tiny_model.forward([BatchEntry(tokens[start : start + 32], cache)])[0]
    np.testing.assert_allclose(last, whole, rtol=1e-4, atol=1e-4)


def test_output_kinds(tiny_model: Model) -> None:
    tokens = _tokens(tiny_model, 6, 8)
    outs = tiny_model.forward([
        BatchEntry(tokens, tiny_model.new_cache(), output="hidden"),
        BatchEntry(tokens, tiny_model.new_cache(), output="none"),
        BatchEntry(tokens, tiny_model.new_cache(), output="all"),
    ])
    assert outs[0].shape == (6, tiny_model.config.d_model)
    assert outs[1] is None
    assert outs[2].shape == (6, tiny_model.config.vocab_size)


def test_context_overflow_is_refused(tiny_model: Model) -> None:
    cache = tiny_model.new_cache()
    with pytest.raises(ContextLengthError):
        tiny_model.forward([BatchEntry(_tokens(tiny_model, tiny_model.config.context_length + 1, 9), cache)])
    assert cache.length == 0
