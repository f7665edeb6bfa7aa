"""Sampling tests: seeding, greedy, truncation (top_k/top_p/min_p), penalties, logit_bias, logprobs."""

from __future__ import annotations

import dataclasses
import math
import pickle
from typing import Any

import numpy as np
import pytest

from worker.engine.decode.batch_sampling import NUCLEUS_PREFIX, SampledToken, log_softmax_top, sample_batch
from worker.engine.decode.sampling import Sampler, SamplingParams

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


def _nucleus_by_full_sort(logits: np.ndarray, params: SamplingParams, uniform: float) -> int:
    """The definition of a top_p/min_p draw: sort the whole row (best first, ties by id), keep the nucleus."""
    scaled = logits.astype(np.float64) / params.temperature
    order = np.lexsort((np.arange(len(scaled)), -scaled))
    weights = np.exp(scaled[order] - scaled.max())
    weights[np.cumsum(weights) - weights >= params.top_p * weights.sum()] = 0.0
    weights[weights < params.min_p] = 0.0
    cumulative = np.cumsum(weights)
    return int(order[min(int((cumulative <= uniform * cumulative[-1]).sum()), len(order) - 1)])


@pytest.mark.parametrize("scale", [8.0, 3.0, 0.5])  # nucleus inside 256, inside 8192, wider than 8192
def test_wide_nuclei_on_a_large_vocabulary_match_the_full_sort(scale: float) -> None:
    vocab = 40_000
    logits = random_logits(7, vocab=vocab, scale=scale)
    for seed in range(20):
        params = SamplingParams(top_p=0.9, temperature=0.9, seed=seed)
        uniform = Sampler(params, vocab).next_uniform()
        assert Sampler(params, vocab).sample(logits, [], []).token_id == _nucleus_by_full_sort(logits, params, uniform)


def test_temperature_only_draws_follow_the_distribution_without_sorting() -> None:
    """The unranked path (no top_k/top_p): frequencies still match softmax(logits / T)."""
    logits = np.log(np.array([0.05, 0.4, 0.15, 0.3, 0.1], np.float32))
    sampler = Sampler(SamplingParams(seed=5, temperature=1.0, min_p=0.2), 5)
    counts = np.bincount([sampler.sample(logits, [], []).token_id for _ in range(4000)], minlength=5) / 4000
    kept = np.array([0.0, 0.4, 0.15, 0.3, 0.1]) / 0.95  # min_p 0.2 of the best (0.4) drops only the 0.05
    assert np.allclose(counts, kept, atol=0.03)


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


def test_min_p_drops_tokens_below_the_ratio() -> None:
    """min_p=0.5 keeps tokens with at least half the best probability."""
    logits = np.full(VOCAB, -10.0, dtype=np.float32)
    logits[1], logits[2], logits[3] = 0.0, math.log(0.6), math.log(0.4)
    assert set(draw(SamplingParams(min_p=0.5, seed=2), logits, 400)) == {1, 2}


def test_temperature_flattens_and_sharpens() -> None:
    """Higher temperature spreads choices; lower concentrates them on the argmax."""
    logits = random_logits(3)
    hot = draw(SamplingParams(temperature=5.0, seed=0), logits, 300)
    cold = draw(SamplingParams(temperature=0.05, seed=0), logits, 300)
    assert len(set(hot)) > len(set(cold))
    assert cold.count(int(np.argmax(logits))) > 250


def test_sampling_follows_the_distribution() -> None:
    """Frequencies of 4000 draws match softmax probabilities within a few percent."""
    logits = np.full(4, 0.0, dtype=np.float32)
    logits[:] = np.log([0.1, 0.2, 0.3, 0.4])
    counts = np.bincount(draw(SamplingParams(seed=11), logits, 4000, vocab=4), minlength=4) / 4000
    assert np.allclose(counts, [0.1, 0.2, 0.3, 0.4], atol=0.03)


# ---------------------------------------------------------------- penalties and bias


def test_repetition_penalty_formula() -> None:
    """Seen tokens (prompt or generated): positive logits divided, negative multiplied; others unchanged."""
    logits = np.array([2.0, -2.0, 3.0, -1.0, 0.5], dtype=np.float32)
    sampler = Sampler(SamplingParams(repetition_penalty=2.0), 5)
    out = sampler.processed_logits(logits, [0, 1, 0], [1, 2])
    assert np.allclose(out, [1.0, -4.0, 1.5, -1.0, 0.5])
    assert np.array_equal(logits, [2.0, -2.0, 3.0, -1.0, 0.5])  # input untouched


def test_presence_and_frequency_penalty_formula() -> None:
    """logit -= presence * (count > 0) + frequency * count, over generated tokens only."""
    logits = np.zeros(5, dtype=np.float32)
    sampler = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), 5)
    out = sampler.processed_logits(logits, [4, 4, 4], [1, 2, 2, 2])
    assert np.allclose(out, [0.0, -0.75, -1.25, 0.0, 0.0])


def test_penalties_apply_in_order() -> None:
    """bias, then repetition (sees the biased sign), then presence/frequency."""
    logits = np.array([1.0, 0.0], dtype=np.float32)
    params = SamplingParams(logit_bias={0: -3.0}, repetition_penalty=2.0, presence_penalty=1.0)
    out = Sampler(params, 2).processed_logits(logits, [], [0])
    assert np.allclose(out, [(1.0 - 3.0) * 2.0 - 1.0, 0.0])


def test_logit_bias_forces_and_bans() -> None:
    """+100 makes a token win every draw; -100 removes it even when it is the argmax."""
    logits = random_logits(5)
    weak = int(np.argmin(logits))
    assert set(draw(SamplingParams(logit_bias={weak: 100.0}, temperature=1.5, seed=0), logits, 50)) == {weak}
    best = int(np.argmax(logits))
    banned_greedy = Sampler(SamplingParams(temperature=0, logit_bias={best: -100.0}), VOCAB)
    assert banned_greedy.sample(logits, [], []).token_id == int(np.argsort(logits)[-2])
    peaked = np.zeros(VOCAB, dtype=np.float32)
    peaked[best] = 50.0
    assert best not in draw(SamplingParams(logit_bias={best: -100.0}, seed=0), peaked, 200)


def test_out_of_range_history_ids_are_refused() -> None:
    """Context/generated ids outside the vocabulary raise instead of wrapping around."""
    sampler = Sampler(SamplingParams(repetition_penalty=1.1), VOCAB)
    with pytest.raises(ValueError, match="token ids"):
        sampler.sample(random_logits(), [-1], [])
    with pytest.raises(ValueError, match="shape"):
        sampler.sample(np.zeros(VOCAB + 1, dtype=np.float32), [], [])


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    """Chosen-token and top-k logprobs equal a float64 log-softmax of the unprocessed logits."""
    logits = random_logits(9, vocab=49152, scale=4.0)
    reference = reference_log_softmax(logits)
    params = SamplingParams(temperature=0.7, repetition_penalty=1.3, logit_bias={17: 5.0}, logprobs=5, seed=0)
    sampler = Sampler(params, 49152)
    result = sampler.sample(logits, [1, 2, 3], [17])
    assert result.logprob == pytest.approx(reference[result.token_id], abs=1e-5)
    expected_top = np.argsort(-reference)[:5]
    assert [i for i, _ in result.top_logprobs] == expected_top.tolist()
    assert np.allclose([lp for _, lp in result.top_logprobs], reference[expected_top], atol=1e-5)


def test_logprobs_off_and_zero() -> None:
    """logprobs=None computes nothing; logprobs=0 gives the chosen token's logprob only."""
    logits = random_logits(1)
    assert Sampler(SamplingParams(seed=0), VOCAB).sample(logits, [], []) == SampledToken(
        Sampler(SamplingParams(seed=0), VOCAB).sample(logits, [], []).token_id
    )
    zero = Sampler(SamplingParams(seed=0, logprobs=0), VOCAB).sample(logits, [], [])
    assert zero.logprob is not None and zero.top_logprobs == []


def test_log_softmax_top_handles_ties() -> None:
    """Equal logits are ordered by token id."""
    logprob, top = log_softmax_top(np.zeros(4, dtype=np.float32), 2, 3)
    assert logprob == pytest.approx(math.log(0.25))
    assert [i for i, _ in top] == [0, 1, 2]


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
