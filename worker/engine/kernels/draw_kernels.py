"""Compiled passes of sampling (worker/engine/decode/batch_sampling.py) over whole rows of the vocabulary: each row's
best `width` tokens, and a draw from each row's cumulative weights. numpy's `argpartition`, float64 `cumsum` and
`lexsort` were most of a sampled token's cost: 0.3-0.9 ms a row of a 49,152-token vocabulary, up to 2.9 ms of
151,936, and 7-23 ms where the nucleus was wide; these passes read each logit once or a few times (0.1-0.5 ms a row,
0.8-2.4 ms for a wide nucleus: docs/benchmarks.md, "Sampling", AMD EPYC, warmed).

All four are exact restatements, rows across the kernel threads (each row alone, so a row never depends on the
batch):
- `best_ids`: the ids of each row's `width` largest values, ties broken by the lower id (the order the sampler then
  sorts them in: best first, ties by id), unordered;
- `cumulative_draws`: for each row, the index `np.searchsorted(np.cumsum(w, dtype=np.float64), u * total, "right")`
  (at most V - 1) would give, total being the float64 sum of the row in order: the same sums, added in the same
  order, so the same token;
- `descending_order`: a row's ids best first, ties by the lower id (`np.lexsort((ids, -row))`), by a stable radix sort
  of the values' bits (four passes of a byte): a nucleus wider than the best 256 sorts its whole row, which
  `lexsort` did in 4.4 ms on 49,152 tokens and 16 ms on 151,936;
- `nucleus_draw`: over a row's weights best first, numpy's top_p mask (`cumsum - w >= limit`), min_p mask (in
  float32, as numpy compares a float32 array with a Python float) and cumulative draw, in three passes instead of
  two float64 cumsums and four temporaries.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from worker.engine.kernels.numba_runtime import launch_lock


@njit(inline="always", cache=True)
def _worse(value_a, id_a, value_b, id_b):  # pragma: no cover (compiled)
    """Whether token a ranks below token b: a lower value, or the same value and a higher id."""
    return value_a < value_b or (value_a == value_b and id_a > id_b)


@njit(nogil=True, cache=True)
def _best_of_row(row, width, heap_values, heap_ids):  # pragma: no cover (compiled)
    """heap_ids (width,) <- the ids of row's `width` best values (ties: the lower id), as a heap whose root is the
    worst kept; heap_values (width,) float32 is its scratch. Ids come in increasing order, so a value equal to the
    root's ranks below it and is skipped."""
    kept = 0
    for token in range(row.shape[0]):
        value = row[token]
        if kept < width:  # filling: sift the newcomer up from the last leaf
            at = kept
            kept += 1
            while at > 0:
                parent = (at - 1) // 2
                if not _worse(value, token, heap_values[parent], heap_ids[parent]):
                    break
                heap_values[at], heap_ids[at] = heap_values[parent], heap_ids[parent]
                at = parent
            heap_values[at], heap_ids[at] = value, token
        elif value > heap_values[0]:  # better than the worst kept: it takes the root's place, sifted down
            at = 0
            while True:
                child = 2 * at + 1
                if child >= width:
                    break
                if child + 1 < width and _worse(heap_values[child + 1], heap_ids[child + 1], heap_values[child],
                                                heap_ids[child]):
                    child += 1
                if not _worse(heap_values[child], heap_ids[child], value, token):
                    break
                heap_values[at], heap_ids[at] = heap_values[child], heap_ids[child]
                at = child
            heap_values[at], heap_ids[at] = value, token


@njit(parallel=True, nogil=True, cache=True)
def _best_ids(rows, width, out):  # pragma: no cover (compiled)
    """out (S, width) <- _best_of_row of each row of rows (S, V)."""
    for r in prange(rows.shape[0]):
        _best_of_row(rows[r], width, np.empty(width, np.float32), out[r])


@njit(parallel=True, nogil=True, cache=True)
def _cumulative_draws(weights, draws, out):  # pragma: no cover (compiled)
    """out (S,) <- for each row of weights (S, V) float32, the first index whose float64 running sum passes
    draws[r] times the row's float64 sum (V - 1 when none does)."""
    vocab = weights.shape[1]
    for r in prange(weights.shape[0]):
        total = 0.0
        for v in range(vocab):
            total += np.float64(weights[r, v])
        target = draws[r] * total
        running, chosen = 0.0, vocab - 1
        for v in range(vocab):
            running += np.float64(weights[r, v])
            if running > target:
                chosen = v
                break
        out[r] = chosen


@njit(nogil=True, cache=True)
def _descending_order(row, out):  # pragma: no cover (compiled)
    """out (V,) <- row's ids by value, best first, ties by the lower id: an LSD radix sort, a byte a pass, of keys
    that order as the values do backwards (-0.0 as 0.0), starting from the ids in order (each pass is stable)."""
    n = row.shape[0]
    bits = row.view(np.uint32)  # (V,)
    keys, spare_keys = np.empty(n, np.uint32), np.empty(n, np.uint32)  # (V,) x2
    ids, spare_ids = out, np.empty(n, np.int64)  # (V,) x2
    for i in range(n):
        b = bits[i] if bits[i] != np.uint32(0x80000000) else np.uint32(0)  # -0.0 ranks as 0.0
        ascending = ~b if b & np.uint32(0x80000000) else b | np.uint32(0x80000000)  # unsigned order = value order
        keys[i] = ~ascending
        ids[i] = i
    counts = np.empty(257, np.int64)  # (257,)
    for shift in range(0, 32, 8):
        counts[:] = 0
        for i in range(n):
            counts[((keys[i] >> shift) & np.uint32(255)) + 1] += 1
        for d in range(256):
            counts[d + 1] += counts[d]
        for i in range(n):
            digit = (keys[i] >> shift) & np.uint32(255)
            at = counts[digit]
            counts[digit] = at + 1
            spare_keys[at], spare_ids[at] = keys[i], ids[i]
        keys, spare_keys = spare_keys, keys
        ids, spare_ids = spare_ids, ids
    # four passes: the sorted ids are back in `out`


def descending_order(row: np.ndarray) -> np.ndarray:
    """A row's (V,) float32 ids best first, ties by the lower id (np.lexsort((ids, -row))): (V,) int64."""
    out = np.empty(row.shape[0], np.int64)  # (V,)
    _descending_order(np.ascontiguousarray(row, dtype=np.float32), out)
    return out


@njit(nogil=True, cache=True)
def _nucleus_draw(weights, limit, min_p, draw):  # pragma: no cover (compiled)
    """The index the draw selects among weights (V,) float32 best first (zeroed in place as the masks say)."""
    n = weights.shape[0]
    running = 0.0
    for i in range(n):  # top_p: a token whose better tokens already weigh `limit` is out
        weight = np.float64(weights[i])
        running += weight
        if running - weight >= limit:
            weights[i] = 0
    total = 0.0
    for i in range(n):
        if weights[i] < min_p:
            weights[i] = 0
        total += np.float64(weights[i])
    target = draw * total
    running = 0.0
    for i in range(n):
        running += np.float64(weights[i])
        if running > target:
            return i
    return n - 1


def nucleus_draw(weights: np.ndarray, limit: float, min_p: float, draw: float) -> int:
    """The index into weights (V,) float32, best first, of the token a top_p draw selects: tokens whose better
    tokens weigh `limit` (top_p x the row's total) or more are out, then those below min_p, then the first whose
    float64 running weight passes draw x the rest's total (the module docstring's). Zeroes weights in place."""
    return int(_nucleus_draw(weights, float(limit), np.float32(min_p), float(draw)))


def best_ids(rows: np.ndarray, width: int) -> np.ndarray:
    """The ids of each row's `width` best values of rows (S, V) float32, ties by the lower id, unordered: (S, W)."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if not 0 < width <= rows.shape[1]:
        raise ValueError(f"width {width} is not within the {rows.shape[1]} values of a row")
    out = np.empty((rows.shape[0], width), np.int64)  # (S, W)
    with launch_lock:
        _best_ids(rows, width, out)
    return out


def cumulative_draws(weights: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """For each row of weights (S, V) float32 and its uniform draw in [0, 1), the token the float64 cumulative
    weights select (the module docstring's): (S,) int64."""
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    out = np.empty(weights.shape[0], np.int64)  # (S,)
    with launch_lock:
        _cumulative_draws(weights, np.ascontiguousarray(draws, dtype=np.float64), out)
    return out


def warm() -> None:
    """Compile (or load from numba's cache) every kernel here, so that a worker's first sampled request does not."""
    row = np.arange(8, dtype=np.float32)[None, :]  # (1, 8)
    best_ids(row, 2)
    cumulative_draws(row, np.zeros(1))
    nucleus_draw(row[0, descending_order(row[0])], 1.0, 0.0, 0.5)
