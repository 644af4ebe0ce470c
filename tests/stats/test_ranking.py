"""Rank transfer against scipy, and the CellPath Wilcoxon win."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from fmaudit import stats
from fmaudit.io import FmauditInputError


# ------------------------------------------------------------------------------------ rank transfer
def test_rank_transfer_matches_scipy_and_flags_dethroning():
    source = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.5}
    target = {"a": 0.70, "b": 0.75, "c": 0.60, "d": 0.65, "e": 0.40}
    result = stats.rank_transfer(source, target)
    keys = list(source)
    rho, rho_p = sps.spearmanr([source[k] for k in keys], [target[k] for k in keys])
    tau, tau_p = sps.kendalltau([source[k] for k in keys], [target[k] for k in keys])
    assert result["spearman_rho"] == pytest.approx(rho) and result["spearman_p"] == pytest.approx(rho_p)
    assert result["kendall_tau_b"] == pytest.approx(tau) and result["kendall_p"] == pytest.approx(tau_p)
    assert result["n_models"] == 5 and result["source_best"] == "a"
    assert result["target_rank_of_source_best"] == 2 and result["dethroned"] is True
    kept = stats.rank_transfer(source, {**target, "a": 0.99})
    assert kept["target_rank_of_source_best"] == 1 and kept["dethroned"] is False
    lower = stats.rank_transfer({"a": 0.1, "b": 0.2, "c": 0.3}, {"a": 0.1, "b": 0.3, "c": 0.2}, higher_is_better=False)
    assert lower["source_best"] == "a" and lower["target_rank_of_source_best"] == 1


def test_rank_transfer_drops_unmatched_and_rejects_bad_scores():
    result = stats.rank_transfer({"a": 1, "b": 2, "c": 3, "x": 4}, {"a": 1, "b": 2, "c": 3, "y": 0})
    assert result["n_models"] == 3 and result["spearman_rho"] == pytest.approx(1.0)
    with pytest.raises(FmauditInputError, match="at least 2"):
        stats.rank_transfer({"a": 1}, {"a": 2})
    with pytest.raises(FmauditInputError, match="non-finite"):
        stats.rank_transfer({"a": 1, "b": float("nan")}, {"a": 1, "b": 2})


def test_wilcoxon_win():
    rng = np.random.default_rng(0)
    b = rng.normal(size=20)
    a = b + 0.5 + 0.1 * rng.normal(size=20)
    result = stats.wilcoxon_win(a, b)
    assert result["p"] == pytest.approx(sps.wilcoxon(a, b).pvalue)
    assert result["win"] and result["median_diff"] > 0 and result["n_nonzero"] == 20
    assert not stats.wilcoxon_win(b, a)["win"]  # significant, but a loss
    few = stats.wilcoxon_win(a[:5], b[:5])  # 5 non-zero pairs: p >= 0.0625
    assert few["p"] >= 0.05 and not few["win"]
    a_nan = a.copy()
    a_nan[:3] = np.nan
    assert stats.wilcoxon_win(a_nan, b)["n_pairs"] == 17
    ties = stats.wilcoxon_win(b, b)
    assert np.isnan(ties["p"]) and not ties["win"] and ties["n_nonzero"] == 0


def test_spearman_rows_matches_scipy_row_by_row():
    from scipy.stats import spearmanr

    from fmaudit.stats import spearman_rows

    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, size=(200, 5)).astype(float)  # small integers: many ties within rows
    y = rng.normal(size=(200, 5))
    y[:5] = x[:5]  # identical rankings
    rho = spearman_rows(x, y)
    for i in range(len(x)):
        if np.ptp(x[i]) == 0:
            assert np.isnan(rho[i])  # a constant row ranks nothing
        else:
            assert rho[i] == pytest.approx(spearmanr(x[i], y[i]).statistic, abs=1e-12)
    assert np.allclose(rho[:5][np.isfinite(rho[:5])], 1.0)


def test_spearman_rows_rejects_bad_shapes():
    from fmaudit.stats import spearman_rows

    with pytest.raises(FmauditInputError, match="one shape"):
        spearman_rows(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(FmauditInputError, match="at least 2"):
        spearman_rows(np.zeros((3, 1)), np.zeros((3, 1)))
    with pytest.raises(FmauditInputError, match="finite"):
        spearman_rows(np.array([[1.0, np.nan]]), np.array([[1.0, 2.0]]))


@pytest.mark.parametrize("n", [3, 4, 5, 6, 8])
def test_wilcoxon_smallest_p_is_what_the_exact_test_gives_when_every_difference_agrees(n):
    a = np.arange(1.0, n + 1) * 2.0
    b = a - np.arange(1.0, n + 1) * 0.1  # every difference positive, distinct: the most extreme signed ranks
    assert stats.wilcoxon_win(a, b)["p"] == pytest.approx(stats.wilcoxon_smallest_p(n))
    assert stats.wilcoxon_win(a, b)["win"] == (stats.wilcoxon_smallest_p(n) < 0.05) == (n >= 6)
