"""worker.engine.kernels.draw_kernels: sampling's compiled passes, against their numpy definitions."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine.kernels.draw_kernels import best_ids, cumulative_draws, descending_order, nucleus_draw


def _best_by_sort(row: np.ndarray, width: int) -> set[int]:
    """The definition: the first `width` ids of the row sorted best first, ties by the lower id."""
    return set(np.lexsort((np.arange(row.size), -row))[:width].tolist())


@pytest.mark.parametrize("width", [1, 2, 40, 256, 999, 1000])
def test_best_ids_are_the_best_values_with_ties_to_the_lower_id(width: int) -> None:
    rng = np.random.default_rng(width)
    rows = np.stack([rng.standard_normal(1000), np.round(rng.standard_normal(1000)),  # many ties
                     np.full(1000, 0.5), np.where(rng.random(1000) < 0.9, -np.inf, rng.standard_normal(1000)),
                     np.arange(1000.0), -np.arange(1000.0)]).astype(np.float32)  # (6, 1000)
    ids = best_ids(rows, width)  # (6, W)
    assert ids.shape == (6, width)
    for row, got in zip(rows, ids, strict=True):
        assert len(set(got.tolist())) == width and set(got.tolist()) == _best_by_sort(row, width)


def test_best_ids_of_a_row_do_not_depend_on_the_other_rows() -> None:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((5, 3000)).astype(np.float32)  # (5, V)
    together = best_ids(rows, 64)
    for i in range(5):
        assert sorted(best_ids(rows[i : i + 1], 64)[0].tolist()) == sorted(together[i].tolist())


def test_best_ids_refuse_a_width_outside_the_row() -> None:
    with pytest.raises(ValueError, match="width"):
        best_ids(np.zeros((1, 4), np.float32), 5)


def test_cumulative_draws_are_searchsorted_on_the_float64_running_sums() -> None:
    rng = np.random.default_rng(5)
    weights = rng.random((8, 5000)).astype(np.float32)  # (8, V)
    weights[1, :4990] = 0.0  # the weight at the end
    weights[2, 1:] = 0.0  # one token
    weights[3] = np.float32(1e-30)  # tiny, equal weights
    draws = np.concatenate([rng.random(6), [0.0, np.nextafter(1.0, 0.0)]])  # (8,) the edges too
    expected = []
    for row, draw in zip(weights, draws, strict=True):
        cumulative = np.cumsum(row, dtype=np.float64)  # (V,)
        expected.append(min(int(np.searchsorted(cumulative, draw * cumulative[-1], side="right")), row.size - 1))
    assert cumulative_draws(weights, draws).tolist() == expected


def test_descending_order_is_lexsort_best_first_ties_by_id() -> None:
    rng = np.random.default_rng(9)
    rows = [rng.standard_normal(5000), np.round(rng.standard_normal(5000) * 3),  # many ties
            np.where(rng.random(5000) < 0.5, -np.inf, rng.standard_normal(5000)),  # banned tokens
            np.array([0.0, -0.0, 1.0, -1.0, -0.0, 0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38]),
            rng.standard_normal(151936) * 10]
    for row in rows:
        row = row.astype(np.float32)
        expected = np.lexsort((np.arange(row.size), -row))
        assert np.array_equal(descending_order(row), expected)


@pytest.mark.parametrize(("top_p", "min_p"), [(0.9, 0.0), (0.5, 0.05), (0.999, 0.3), (1e-6, 0.0)])
def test_nucleus_draw_is_numpys_masks_and_cumulative_draw(top_p: float, min_p: float) -> None:
    """The definition it restates: two float64 cumsums and the masks, as the sampler wrote them in numpy."""
    rng = np.random.default_rng(11)
    for scale in (0.3, 1.0, 4.0):
        row = np.sort(np.exp(rng.standard_normal(20000) * scale).astype(np.float32))[::-1]  # (V,) best first
        row /= row[0]  # the best weighs 1, as exp(scaled - peak) does
        total = float(row.sum(dtype=np.float64)) * 1.01  # the whole row's, of which these are the best
        for draw in (*rng.random(5), 0.0):
            weights = row.copy()
            cumulative = np.cumsum(weights, dtype=np.float64)
            weights[cumulative - weights >= top_p * total] = 0.0
            weights[weights < min_p] = 0.0
            cumulative = np.cumsum(weights, dtype=np.float64)
            expected = min(int((cumulative <= draw * cumulative[-1]).sum()), row.size - 1)
            assert nucleus_draw(row.copy(), top_p * total, min_p, float(draw)) == expected
