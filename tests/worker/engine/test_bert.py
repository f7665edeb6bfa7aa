"""The `bert` encoder against llama.cpp's vectors for all-MiniLM-L6-v2 (our converter, our tokenizer, our engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from worker.engine import ops

MIN_COSINE = 0.9999


def test_bidirectional_attention_keeps_each_text_to_itself() -> None:
    rng = np.random.default_rng(0)
    lengths = [3, 1, 7, 2]
    starts = np.concatenate([[0], np.cumsum(lengths)])  # (B+1,)
    q, k, v = (rng.standard_normal((starts[-1], 2, 4)).astype(np.float32) for _ in range(3))  # (N, H, Dh)
    out = ops.attend_bidirectional(q, k, v, starts)  # (N, H*Dh)
    for a, b in zip(starts[:-1], starts[1:]):
        scores = np.einsum("qhd,khd->hqk", q[a:b], k[a:b])  # (H, T, T)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        expected = np.einsum("hqk,khd->qhd", probs, v[a:b]).reshape(b - a, -1)  # (T, H*Dh)
        np.testing.assert_allclose(out[a:b], expected, rtol=1e-5, atol=1e-6)


def test_layer_norm_matches_its_definition() -> None:
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)  # (N, D)
    w, b = np.linspace(0.5, 2, 8, dtype=np.float32), np.linspace(-1, 1, 8, dtype=np.float32)
    expected = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-12) * w + b
    np.testing.assert_allclose(ops.layer_norm(x, w, b, 1e-12), expected, rtol=1e-5, atol=1e-5)


def cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two vectors."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module", params=["f32", "f16"])
def minilm(request: pytest.FixtureRequest, minilm_f32_path: Path, minilm_f16_path: Path):
    """(kind, Engine) for the F32 and the F16 conversion."""
    from worker.engine.engine import Engine

    path = minilm_f32_path if request.param == "f32" else minilm_f16_path
    return request.param, Engine.load(path)


@pytest.mark.slow
def test_every_text_matches_llama_cpp(minilm, minilm_reference: dict[str, Any]) -> None:
    kind, engine = minilm
    assert engine.embedding_only and engine.chat_template is None
    for entry in minilm_reference["texts"]:
        if entry[f"embedding_{kind}"] is None:
            continue
        vector = engine.embed(engine.encode_prompt(entry["text"]))  # (D,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
        assert cosine(vector, entry[f"embedding_{kind}"]) >= MIN_COSINE, (kind, entry["text"][:60])


@pytest.mark.slow
def test_a_batch_gives_the_vectors_of_one_at_a_time(minilm, minilm_reference: dict[str, Any]) -> None:
    _, engine = minilm
    inputs = [engine.encode_prompt(e["text"]) for e in minilm_reference["texts"] if e["n_tokens"] <= 512]
    batch = engine.embed_batch(inputs)  # (B, D)
    for ids, vector in zip(inputs, batch):
        np.testing.assert_allclose(vector, engine.embed(ids), atol=2e-6)


@pytest.mark.slow
def test_similarities_match_llama_cpp(minilm, minilm_reference: dict[str, Any]) -> None:
    kind, engine = minilm
    for pair in minilm_reference["similarity"]:
        a, b = (engine.embed(engine.encode_prompt(pair[side])) for side in ("a", "b"))
        assert abs(cosine(a, b) - pair[f"cosine_{kind}"]) <= 1e-3, pair


@pytest.mark.slow
def test_over_the_context_is_refused_and_the_bert_cut_matches(minilm, minilm_reference: dict[str, Any]) -> None:
    from worker.engine.errors import ContextLengthError

    kind, engine = minilm
    long = next(e for e in minilm_reference["texts"] if e["n_tokens"] > 512)
    ids = engine.encode_prompt(long["text"])
    assert len(ids) == 567
    with pytest.raises(ContextLengthError):
        engine.embed(ids)
    cut = long["truncated_512"]  # [CLS] + the first 510 + [SEP]: all 512 positions in use
    assert ids[:511] + [ids[-1]] == cut["ids"]
    assert cosine(engine.embed(cut["ids"]), cut[f"embedding_{kind}"]) >= MIN_COSINE
