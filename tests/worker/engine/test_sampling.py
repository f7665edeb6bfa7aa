"""Sampling tests: seeding, greedy, truncation (top_k/top_p/min_p), penalties, logit_bias, logprobs."""

from __future__ import annotations

import dataclasses
import math
import pickle
from typing import Any

import numpy as np
import pytest

from worker.engine.batch_sampling import NUCLEUS_PREFIX, sample_batch
from worker.engine.sampling import Sampler, SamplingParams

VOCAB = 1000


def random_logits(seed: int = 0, vocab: int = VOCAB, scale: float = 2.0) -> np.ndarray:
    """Gaussian logits (V,) float32."""
    return (np.random.default_rng(seed).standard_normal(vocab) * scale).astype(np.float32)


def draw(params: SamplingParams, logits: np.ndarray, count: int, vocab: int = VOCAB) -> list[int]:
    """`count` tokens from one sampler over the same logits."""
    sampler = Sampler(params, vocab)
    return [sampler.sample(logits, [], []).token_id for _ in range(count)]


def reference_log_softmax(logits: np.ndarray) -> np.ndarray:
    """log-softmax (V,) in float64, the straightforward way."""
    values = logits.astype(np.float64)
    return values - values.max() - np.log(np.exp(values - values.max()).sum())


# ---------------------------------------------------------------- params


def test_params_defaults_are_valid_and_hashable() -> None:
    """Defaults validate; the frozen dataclass hashes even with a logit_bias dict."""
    params = SamplingParams()
    params.validate(VOCAB)
    assert hash(params) == hash(SamplingParams())
    assert SamplingParams(logit_bias={"5": 1}) == SamplingParams(logit_bias={5: 1.0})
    assert SamplingParams(logit_bias=None).logit_bias == {}  # type: ignore[arg-type]
    SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3)).validate(VOCAB)
    assert pickle.loads(pickle.dumps(SamplingParams(logit_bias={5: 1.0}, seed=3))).logit_bias == {5: 1.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"logit_bias": {VOCAB: 1.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {1: 101.0}}, "logit_bias"),
        ({"seed": "x"}, "seed"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_validate_names_the_bad_field(changes: dict[str, Any], field: str) -> None:
    """Each out-of-range field gives a ValueError that starts with its name."""
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingParams(**changes).validate(VOCAB)
    with pytest.raises(ValueError, match=f"^{field} must be"):
        Sampler(SamplingParams(**changes), VOCAB)


def test_logit_bias_keys_must_be_ids() -> None:
    """Non-numeric logit_bias keys are refused at construction."""
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"abc": 1.0})


# ---------------------------------------------------------------- seeding


def test_same_seed_same_tokens_different_seed_differs() -> None:
    """A seed fixes the 50-token sequence; another seed gives another sequence."""
    logits = random_logits(scale=0.5)  # flat enough that draws vary
    first = draw(SamplingParams(seed=1234), logits, 50)
    assert first == draw(SamplingParams(seed=1234), logits, 50)
    assert first != draw(SamplingParams(seed=4321), logits, 50)
    assert len(set(first)) > 10


def test_unseeded_sampler_exposes_its_seed_and_can_be_resumed() -> None:
    """A random seed is exposed; seed + skip_draws reproduces the rest of the stream."""
    logits = random_logits(scale=0.5)
    original = Sampler(SamplingParams(top_p=0.9), VOCAB)
    assert isinstance(original.seed, int)
    tokens = [original.sample(logits, [], []).token_id for _ in range(30)]
    resumed = Sampler(SamplingParams(top_p=0.9, seed=original.seed), VOCAB)
    resumed.skip_draws(20)
    assert [resumed.sample(logits, [], []).token_id for _ in range(10)] == tokens[20:]
    assert original.draws == 30 and resumed.draws == 30


def test_samplers_do_not_share_random_state() -> None:
    """Interleaving two seeded samplers does not change either one's stream."""
    logits = random_logits(scale=0.5)
    alone = draw(SamplingParams(seed=7), logits, 20)
    a, b = Sampler(SamplingParams(seed=7), VOCAB), Sampler(SamplingParams(seed=8), VOCAB)
    interleaved = []
    for _ in range(20):
        interleaved.append(a.sample(logits, [], []).token_id)
        b.sample(logits, [], [])
    assert interleaved == alone


# ---------------------------------------------------------------- greedy and truncation


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=1e-6)])
def test_greedy_is_argmax(params: SamplingParams) -> None:
    """Temperature 0 (or below 1e-5) picks the argmax every time, without drawing."""
    for seed in range(5):
        logits = random_logits(seed)
        sampler = Sampler(params, VOCAB)
        assert sampler.sample(logits, [], []).token_id == int(np.argmax(logits))
        assert sampler.draws == 0


def test_top_k_1_equals_greedy() -> None:
    """top_k=1 at any temperature is the argmax."""
    for seed in range(5):
        logits = random_logits(seed)
        assert set(draw(SamplingParams(top_k=1, temperature=5.0, seed=seed), logits, 20)) == {
            int(np.argmax(logits))
        }


def test_top_k_only_picks_the_k_best() -> None:
    """With top_k=5 only the five highest logits are ever chosen, and all of them can be."""
    logits = np.zeros(VOCAB, dtype=np.float32)
    allowed = {3, 99, 500, 501, 998}
    logits[list(allowed)] = 1.0
    logits[[7, 8]] = 0.99  # close runners-up that must never appear
    tokens = draw(SamplingParams(top_k=5, temperature=3.0, seed=0), logits, 400)
    assert set(tokens) == allowed


def test_top_p_keeps_the_smallest_nucleus() -> None:
    """Probabilities 0.5/0.3/0.15/...: top_p=0.8 keeps exactly the first two tokens."""
    probs = np.full(VOCAB, 0.05 / (VOCAB - 3))
    probs[[10, 20, 30]] = [0.5, 0.3, 0.15]
    logits = np.log(probs).astype(np.float32)
    tokens = draw(SamplingParams(top_p=0.8, seed=1), logits, 400)
    assert set(tokens) == {10, 20}
    assert set(draw(SamplingParams(top_p=0.81, seed=1), logits, 400)) == {10, 20, 30}
    assert set(draw(SamplingParams(top_p=0.01, seed=1), logits, 50)) == {10}


def test_nucleus_outside_the_prefix() -> None:
    """A flat distribution (nucleus wider than the fast prefix) still gives the exact nucleus."""
    vocab = 10 * NUCLEUS_PREFIX
    logits = np.zeros(vocab, dtype=np.float32)
    logits[:5] = math.log(2.0)  # five tokens of weight 2, the rest weight 1
    expected = math.ceil(0.5 * (vocab + 5) - 10) + 5  # five 2.0s, then enough 1.0s (ties by id)
    tokens = draw(SamplingParams(top_p=0.5, seed=4), logits, 3000, vocab=vocab)
    assert max(tokens) < expected and len(set(tokens)) > expected // 2


def test_rows_do_not_depend_on_the_rest_of_the_batch() -> None:
    """A row samples the same token whatever else is in the batch (a resumed stream reproduces)."""
    logits = np.stack([random_logits(s) for s in range(6)])  # (6, V)
    params = [SamplingParams(seed=1, top_k=3), SamplingParams(seed=2, top_p=0.9), SamplingParams(seed=3),
              SamplingParams(seed=4, min_p=0.2, temperature=0.7), SamplingParams(seed=5, top_k=400, top_p=0.5),
              SamplingParams(temperature=0, repetition_penalty=1.3, presence_penalty=0.5)]
    together = [sample_batch([Sampler(p, VOCAB) for p in params], logits, [[1, 2]] * 6, [[3]] * 6)
                for _ in range(2)]
    assert together[0] == together[1]
    alone = [Sampler(p, VOCAB).sample(logits[i], [1, 2], [3]) for i, p in enumerate(params)]
    assert together[0] == alone


# ---------------------------------------------------------------- batch helper


def test_sample_batch_matches_per_row_sampling() -> None:
    """A batch gives what each row gives alone; a -100/+100 bias bans/forces."""
    logits = np.stack([random_logits(s) for s in range(4)])  # (4, V)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(seed=3),
        SamplingParams(temperature=0, logprobs=2),
    ]
    params.append(SamplingParams(temperature=0, logit_bias={0: 100.0}))
    batch = sample_batch([Sampler(p, VOCAB) for p in params], logits, [[]] * 4, [[]] * 4)
    single = [Sampler(p, VOCAB).sample(logits[i], [], []) for i, p in enumerate(params)]
    assert batch == single
    assert batch[0].token_id == int(np.argmax(logits[0])) and batch[3].token_id == 0
