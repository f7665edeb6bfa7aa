"""Mixture-of-experts FFNs: each token's experts and weights from its router logits, and the step's (token, expert)
pairs grouped by expert, so that every used expert's weights are read once per step for all of its rows.

Routing is llama.cpp's build_moe_ffn, per token and in one fixed order: the router's logits (E,) become
probabilities by softmax (or, gpt-oss's "softmax weight", the top k logits are chosen and softmaxed among
themselves); the k largest are chosen, largest first (a tie: the lower expert first); their weights are
renormalised to sum 1 where the family says so, and scaled where the file says so. A token's FFN output is its
experts' outputs times their weights, added in that order. Nothing in a token's route or sum depends on the other
tokens of its step, and the grouped matmuls compute each pair's row alone (ops.expert_linear), so batch
invariance holds bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numba import njit

from worker.engine.weights.interleaved_blocks import InterleavedBlocks
from worker.engine.weights.interleaved_k_blocks import TILE_ROWS, InterleavedK
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4
from worker.engine.weights.quant_blocks import BlockCodes
from worker.engine.weights.quantized import QuantizedLinear

SOFTMAX, SOFTMAX_WEIGHT = 0, 1  # gating: softmax over all experts, then top k; top k logits, then their softmax
WEIGHT_SUM_FLOOR = 6.103515625e-5  # llama.cpp clamps a renormalising sum to the smallest normal float16


@dataclass(frozen=True)
class StackedExperts:
    """One projection of E experts stacked into an (E * rows, in) weight (llama.cpp's `*_exps` tensors), expert e
    owning rows e * rows .. (e + 1) * rows - 1."""

    weight: Any  # an (E * rows, in) float32 array or a QuantizedLinear (PendingLinear while loading)
    count: int  # E
    rows: int  # output rows of one expert

    @property
    def nbytes(self) -> int:
        """Bytes of the stacked weight."""
        return int(self.weight.nbytes)


@dataclass(frozen=True)
class Routing:
    """The step's (token, expert) pairs, grouped by expert (ascending), and how each token's pairs combine."""

    experts: np.ndarray  # (U,) int64 the experts the step uses, ascending
    starts: np.ndarray  # (U+1,) int64 pair offsets: expert experts[i] owns pairs starts[i] .. starts[i+1]-1
    pair_token: np.ndarray  # (P,) int64 the token (row of x) of each pair
    pair_of: np.ndarray  # (N, k) int64 the pair of each token's rank-j expert
    weights: np.ndarray  # (N, k) float32 each token's expert weights, in rank order

    @property
    def pair_expert(self) -> np.ndarray:
        """The expert of each pair: (P,) int64."""
        return np.repeat(self.experts, np.diff(self.starts))  # (P,)


@njit(cache=True, nogil=True)
def _choose(logits, k, gating, normalize, scale, chosen, weights):  # pragma: no cover (compiled)
    """chosen (N, k) and weights (N, k) of every token from its logits (N, E), in the module docstring's order."""
    n_tokens, n_experts = logits.shape
    probs = np.empty(n_experts, np.float32)
    for t in range(n_tokens):
        row = logits[t]
        if gating == SOFTMAX:
            _softmax(row, probs)
        else:
            probs[:] = row
        for j in range(k):  # selection: the largest left, the lower index on a tie
            best = -1
            for e in range(n_experts):
                taken = False
                for i in range(j):
                    taken = taken or chosen[t, i] == e
                if not taken and (best < 0 or probs[e] > probs[best]):
                    best = e
            chosen[t, j] = best
            weights[t, j] = probs[best]
        if gating == SOFTMAX_WEIGHT:
            _softmax(weights[t].copy(), weights[t])
        if normalize:
            total = 0.0  # float64, as ggml_sum_rows accumulates
            for j in range(k):
                total += weights[t, j]
            floor = np.float32(max(np.float32(total), np.float32(WEIGHT_SUM_FLOOR)))
            for j in range(k):
                weights[t, j] = weights[t, j] / floor
        if scale != 0.0 and scale != 1.0:
            for j in range(k):
                weights[t, j] = weights[t, j] * np.float32(scale)


@njit(inline="always", cache=True)
def _softmax(row, out):  # pragma: no cover (compiled)
    """ggml_soft_max of one row: exp(x - max) in float32, summed in float64, times 1/sum."""
    peak = row[0]
    for e in range(1, row.shape[0]):
        peak = max(peak, row[e])
    total = 0.0
    for e in range(row.shape[0]):
        value = np.float32(math.exp(np.float32(row[e] - peak)))
        out[e] = value
        total += value
    inverse = np.float32(1.0 / total)
    for e in range(row.shape[0]):
        out[e] = out[e] * inverse


def route(logits: np.ndarray, k: int, *, gating: int = SOFTMAX, normalize: bool = True,
          scale: float = 0.0) -> Routing:
    """Each token's k experts and weights from router logits (N, E), and the pairs grouped by expert."""
    logits = np.ascontiguousarray(logits, np.float32)  # (N, E)
    n_tokens = logits.shape[0]
    chosen = np.empty((n_tokens, k), np.int64)  # (N, k)
    weights = np.empty((n_tokens, k), np.float32)  # (N, k)
    _choose(logits, k, gating, normalize, scale, chosen, weights)
    flat = chosen.reshape(-1)  # (P,) token-major
    order = np.argsort(flat, kind="stable")  # (P,) pairs by expert, then token, then rank
    experts, counts = np.unique(flat, return_counts=True)  # (U,) x2
    pair_of = np.empty(len(flat), np.int64)  # (P,)
    pair_of[order] = np.arange(len(flat))
    return Routing(experts.astype(np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                   (order // k).astype(np.int64), pair_of.reshape(n_tokens, k), weights)


def combine(pair_out: np.ndarray, routing: Routing) -> np.ndarray:
    """Each token's experts' rows (P, D) times their weights, added in rank order: (N, D)."""
    weights = routing.weights  # (N, k)
    total = pair_out[routing.pair_of[:, 0]] * weights[:, :1]  # (N, D)
    for j in range(1, weights.shape[1]):
        total += pair_out[routing.pair_of[:, j]] * weights[:, j : j + 1]  # (N, D)
    return total


def expert_rows(weight: Any, expert: int, rows: int) -> Any:
    """The (rows, in) block of expert `expert` in a stacked weight, a view: float32 arrays and every quantized form
    whose rows are whole interleaved groups."""
    first = expert * rows
    if isinstance(weight, np.ndarray):
        return weight[first : first + rows]  # (rows, in)
    if isinstance(weight, QuantizedLinear):
        return QuantizedLinear(_block_rows(weight.blocks, first, rows), weight.column_scale)
    raise TypeError(f"no expert view of {type(weight).__name__}")


def _block_rows(blocks: Any, first: int, rows: int) -> Any:
    """Rows first .. first + rows - 1 of a quantized matrix, a view."""
    if isinstance(blocks, BlockCodes):
        return replace(blocks, codes=blocks.codes[first : first + rows], scale=blocks.scale[first : first + rows],
                       offset=blocks.offset[first : first + rows])
    if isinstance(blocks, (InterleavedK, InterleavedBlocks, InterleavedMXFP4)):
        if first % TILE_ROWS or rows % TILE_ROWS:
            raise ValueError(f"experts of {rows} rows are not whole groups of {TILE_ROWS} rows")
        g0, g1 = first // TILE_ROWS, (first + rows) // TILE_ROWS
        groups = {name: array[g0:g1] for name, array in blocks.arrays().items()}
        return replace(blocks, out=rows, **groups)
    raise TypeError(f"no expert view of {type(blocks).__name__}")
