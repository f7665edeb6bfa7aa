"""Routing (softmax over experts, top k, renormalised or softmaxed weights) against a plain numpy model of llama.cpp's
build_moe_ffn, and the grouped expert matmuls: every form gives each pair the row `linear` gives it alone."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.quant_data import random_blocks, random_mxfp4
from worker.engine import ops
from worker.engine.experts import (
    SOFTMAX_WEIGHT,
    WEIGHT_SUM_FLOOR,
    StackedExperts,
    combine,
    expert_rows,
    route,
)
from worker.engine.formats.gguf_file import QuantizedTensor
from worker.engine.weights.quantized import PendingLinear, QuantizedLinear, build_codes


def reference_route(logits: np.ndarray, k: int, softmax_weight: bool = False, normalize: bool = True,
                    scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Chosen experts (N, k) and weights (N, k) in float64, as build_moe_ffn computes them."""
    logits = logits.astype(np.float64)  # (N, E)
    probs = logits if softmax_weight else np.exp(logits - logits.max(1, keepdims=True))  # (N, E)
    if not softmax_weight:
        probs = probs / probs.sum(1, keepdims=True)
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, :k]  # (N, k)
    weights = np.take_along_axis(probs, chosen, 1)  # (N, k)
    if softmax_weight:
        weights = np.exp(weights - weights.max(1, keepdims=True))
        weights /= weights.sum(1, keepdims=True)
    if normalize:
        weights /= np.maximum(weights.sum(1, keepdims=True), WEIGHT_SUM_FLOOR)
    if scale not in (0.0, 1.0):
        weights *= scale
    return chosen, weights


@pytest.mark.parametrize("softmax_weight, normalize, scale", [(False, True, 0.0), (False, False, 2.5),
                                                              (True, False, 0.0)])
def test_routing_is_build_moe_ffns(softmax_weight: bool, normalize: bool, scale: float) -> None:
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((37, 16)).astype(np.float32)  # (N, E)
    routing = route(logits, 4, gating=SOFTMAX_WEIGHT if softmax_weight else 0, normalize=normalize, scale=scale)
    chosen, weights = reference_route(logits, 4, softmax_weight, normalize, scale)
    assert np.allclose(routing.weights, weights, rtol=1e-6, atol=1e-7)
    pairs = np.repeat(routing.experts, np.diff(routing.starts))  # (P,) expert of each pair
    assert np.array_equal(pairs[routing.pair_of], chosen)  # each token's rank-j pair is its rank-j expert
    assert np.array_equal(routing.pair_token[routing.pair_of], np.repeat(np.arange(37)[:, None], 4, axis=1))
    assert list(routing.experts) == sorted(set(chosen.reshape(-1)))


def test_a_tie_takes_the_lower_expert_first() -> None:
    routing = route(np.array([[0.0, 2.0, 1.0, 2.0]], np.float32), 2, normalize=False)
    pairs = np.repeat(routing.experts, np.diff(routing.starts))
    assert list(pairs[routing.pair_of[0]]) == [1, 3]


def test_combine_adds_in_rank_order() -> None:
    routing = route(np.array([[3.0, 1.0, 2.0]], np.float32), 3, normalize=False)
    rows = np.array([[1e8], [1.0], [-1e8]], np.float32)  # the rows of experts 0, 1, 2 (pairs ascend by expert)
    w = routing.weights[0]
    expected = np.float32(np.float32(rows[0, 0] * w[0]) + np.float32(rows[2, 0] * w[1])) + np.float32(rows[1, 0] * w[2])
    assert combine(rows, routing)[0, 0] == expected


def _stacked(kind: str, experts: int, rows: int, cols: int, rng: np.random.Generator) -> StackedExperts:
    """Random experts of one quantized kind, stacked and built as the loader builds them."""
    raw = random_mxfp4(experts * rows, cols, rng, (118, 130)) if kind == "MXFP4" else random_blocks(
        kind, experts * rows, cols, rng)
    tensor = QuantizedTensor(kind, (experts * rows, cols), raw)
    pending = PendingLinear(kind, tensor.shape, 32, tensor.decode, kind=kind)
    return StackedExperts(QuantizedLinear(build_codes(pending)), experts, rows)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "MXFP4"])
def test_each_pair_gets_the_row_its_expert_gives_it_alone(kind: str) -> None:
    rng = np.random.default_rng(2)
    stacked = _stacked(kind, 6, 32, 256, rng)
    x = rng.standard_normal((9, 256)).astype(np.float32)  # (N, in)
    routing = route(rng.standard_normal((9, 6)).astype(np.float32), 2)
    out = ops.expert_linear(x, stacked, routing)  # (P, 32)
    for pair, token in enumerate(routing.pair_token):
        expert = int(np.repeat(routing.experts, np.diff(routing.starts))[pair])
        alone = ops.linear(x[token : token + 1], expert_rows(stacked.weight, expert, 32))  # (1, 32)
        assert np.array_equal(out[pair], alone[0]), (kind, pair)
    per_pair = ops.expert_linear(np.ascontiguousarray(x[routing.pair_token]), stacked, routing, per_pair=True)
    assert np.array_equal(per_pair, out)


def test_float_experts_are_sliced_rows() -> None:
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((4 * 8, 16)).astype(np.float32)  # (E*rows, in)
    x = rng.standard_normal((5, 16)).astype(np.float32)  # (N, in)
    routing = route(rng.standard_normal((5, 4)).astype(np.float32), 2)
    out = ops.expert_linear(x, StackedExperts(weight, 4, 8), routing)  # (P, 8)
    experts = np.repeat(routing.experts, np.diff(routing.starts))  # (P,)
    expected = np.einsum("pd,prd->pr", x[routing.pair_token], weight.reshape(4, 8, 16)[experts])  # (P, 8)
    assert np.allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_expert_rows_refuses_a_split_group() -> None:
    rng = np.random.default_rng(4)
    stacked = _stacked("Q4_K", 2, 32, 256, rng)
    with pytest.raises(ValueError, match="whole groups"):
        expert_rows(stacked.weight, 1, 24)
