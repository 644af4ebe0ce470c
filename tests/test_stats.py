"""fmaudit.stats: vectorised bootstraps, paired comparisons, rank transfer, meta-analysis (METHODS 7)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from fmaudit import metrics, stats
from fmaudit.io import FmauditInputError


def _model(n: int, k: int, seed: int, skill: float = 1.0, labels: np.ndarray | None = None):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n) if labels is None else labels
    z = rng.normal(size=(n, k)) * 1.5
    z[np.arange(n), y] += skill
    return metrics.softmax(z), y


@pytest.fixture(scope="module")
def data():
    p, y = _model(300, 4, seed=0)
    groups = np.repeat(np.arange(30), 10)
    return p, y, groups


# ------------------------------------------------------------------------------------------- counts
def test_counts_match_seed_003_sequential_draws():
    counts = stats.bootstrap_counts(50, n_boot=7, random_state=3)
    assert counts.shape == (7, 50) and counts.dtype == np.int32
    rng = np.random.default_rng(3)
    expected = np.stack([np.bincount(rng.integers(0, 50, 50), minlength=50) for _ in range(7)])
    np.testing.assert_array_equal(counts, expected)
    assert (counts.sum(1) == 50).all()
    np.testing.assert_array_equal(counts, stats.bootstrap_counts(50, n_boot=7, random_state=3))


def test_grouped_counts_keep_groups_whole():
    groups = np.array(["s3", "s1", "s1", "s2", "s3", "s3", "s4", "s1"])
    counts = stats.bootstrap_counts(len(groups), groups=groups, n_boot=20, random_state=1)
    for g in np.unique(groups):
        members = counts[:, groups == g]
        assert (members == members[:, :1]).all()
    # seed 003: G groups drawn per resample (sorted ids), every member taken per draw
    rng = np.random.default_rng(1)
    uniq, code = np.unique(groups, return_inverse=True)
    for row in counts:
        drawn = rng.integers(0, len(uniq), len(uniq))
        np.testing.assert_array_equal(row, np.bincount(drawn, minlength=len(uniq))[code])
    assert (counts.sum(1) != counts.sum(1)[0]).any()  # resample size varies with the groups drawn


def test_counts_bad_input():
    with pytest.raises(FmauditInputError, match="groups"):
        stats.bootstrap_counts(5, groups=[0, 1, 2])
    with pytest.raises(FmauditInputError, match="n_boot"):
        stats.bootstrap_counts(5, n_boot=0)
    with pytest.raises(FmauditInputError, match="groups"):
        stats.bootstrap_counts(2, groups=np.array([0.0, np.nan]))


# ------------------------------------------------------------------------------------------ kernels
NAIVE = {
    "accuracy": metrics.accuracy,
    "macro_f1": metrics.macro_f1,
    "balanced_accuracy": metrics.balanced_accuracy,
    "ece": metrics.ece,
    "nll": metrics.nll,
    "brier": metrics.brier,
    "auroc": metrics.auroc,
    "qwk": metrics.qwk,
    "aurc": metrics.aurc,
}


@pytest.mark.parametrize("metric_name", sorted(NAIVE))
@pytest.mark.parametrize("grouped", [False, True])
def test_weighted_kernels_equal_naive_recomputation(data, metric_name, grouped):
    p, y, groups = data
    counts = stats.bootstrap_counts(len(y), groups=groups if grouped else None, n_boot=4, random_state=2)
    values = stats.bootstrap_metric(metric_name, p, y, counts)
    for b in range(4):
        idx = np.repeat(np.arange(len(y)), counts[b])
        assert values[b] == pytest.approx(NAIVE[metric_name](p[idx], y[idx]), rel=1e-12, abs=1e-14)


def test_kernels_with_ties_and_other_closure():
    rng = np.random.default_rng(3)
    p = rng.choice([0.2, 0.4, 0.6, 0.8], size=(120, 1))
    p = np.hstack([1 - p, p])  # binary, confidences on 4-bin edges, heavy AUROC ties
    y = rng.integers(0, 2, 120)
    counts = stats.bootstrap_counts(120, n_boot=5, random_state=0)
    auc = stats.bootstrap_metric("auroc", p, y, counts)
    ece_left = stats.bootstrap_metric("ece", p, y, counts, n_bins=5, closure="[lo,hi)")
    for b in range(5):
        idx = np.repeat(np.arange(120), counts[b])
        assert auc[b] == pytest.approx(metrics.auroc(p[idx], y[idx]), abs=1e-14)
        assert ece_left[b] == pytest.approx(metrics.ece(p[idx], y[idx], n_bins=5, closure="[lo,hi)"), abs=1e-14)
    p3, y3 = _model(150, 3, seed=4)
    p3 = np.round(p3, 1) + 1e-3  # heavy ties in every one-vs-rest problem
    p3 = p3 / p3.sum(1, keepdims=True)
    counts3 = stats.bootstrap_counts(150, n_boot=3, random_state=5)
    auc3 = stats.bootstrap_metric("auroc", p3, y3, counts3)
    for b in range(3):
        idx = np.repeat(np.arange(150), counts3[b])
        assert auc3[b] == pytest.approx(metrics.auroc(p3[idx], y3[idx]), abs=1e-14)


def test_nll_kernel_infinite_only_when_resampled():
    p = np.array([[1.0, 0.0], [0.7, 0.3], [0.4, 0.6]])
    y = np.array([1, 0, 1])  # item 0 has probability 0 on its label
    counts = np.array([[1, 1, 1], [0, 2, 1]], dtype=np.int32)
    values = stats.bootstrap_metric("nll", p, y, counts)
    assert values[0] == np.inf
    assert values[1] == pytest.approx(metrics.nll(p[[1, 1, 2]], y[[1, 1, 2]]))


def test_auroc_resample_missing_a_class_is_nan(data):
    p, y, _ = data
    counts = np.ones((2, len(y)), dtype=np.int32)
    counts[1, y == 2] = 0
    values = stats.bootstrap_metric("auroc", p, y, counts)
    assert values[0] == pytest.approx(metrics.auroc(p, y), abs=1e-14) and np.isnan(values[1])


def test_bootstrap_metric_bad_input(data):
    p, y, _ = data
    counts = stats.bootstrap_counts(len(y), n_boot=2)
    with pytest.raises(FmauditInputError, match="unknown metric"):
        stats.bootstrap_metric("f2", p, y, counts)
    with pytest.raises(FmauditInputError, match="counts"):
        stats.bootstrap_metric("accuracy", p, y, counts[:, 1:])
    with pytest.raises(FmauditInputError, match="n_bins"):
        stats.bootstrap_metric("accuracy", p, y, counts, n_bins=10)
    with pytest.raises(FmauditInputError, match="no items"):
        stats.bootstrap_metric("accuracy", p, y, np.zeros((1, len(y)), dtype=np.int32))
    bad = p.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FmauditInputError, match="non-finite"):
        stats.bootstrap_metric("accuracy", bad, y, counts)


# ----------------------------------------------------------------------------------------------- CIs
@pytest.mark.parametrize("metric_name", ["macro_f1", "ece_top_15_lohi", "auroc_ovr_macro", "brier_sum"])
def test_cluster_ci_covers_point_and_is_deterministic(data, metric_name):
    p, y, groups = data
    result = stats.cluster_bootstrap_ci(metric_name, p, y, groups=groups, n_boot=300, random_state=1)
    assert result["ci_lo"] < result["point"] < result["ci_hi"]
    assert result["unit"] == "group" and result["n_boot"] == 300 and result["n_valid"] == 300
    assert result == stats.cluster_bootstrap_ci(metric_name, p, y, groups=groups, n_boot=300, random_state=1)


def test_cluster_ci_is_wider_than_item_ci_for_clustered_errors():
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(20), 25)
    good_group = rng.random(20) < 0.5
    y = rng.integers(0, 2, 500)
    right = np.where(good_group[groups], rng.random(500) < 0.95, rng.random(500) < 0.4)
    pred = np.where(right, y, 1 - y)
    p = np.where(pred[:, None] == np.arange(2), 0.8, 0.2)
    item = stats.cluster_bootstrap_ci("accuracy", p, y, n_boot=500, random_state=0)
    cluster = stats.cluster_bootstrap_ci("accuracy", p, y, groups=groups, n_boot=500, random_state=0)
    assert item["unit"] == "item" and item["point"] == cluster["point"]
    assert cluster["ci_hi"] - cluster["ci_lo"] > 2 * (item["ci_hi"] - item["ci_lo"])


def test_paired_identical_models_have_zero_difference(data):
    p, y, groups = data
    result = stats.paired_bootstrap_diff("macro_f1", p, p.copy(), y, n_boot=200, groups=groups)
    assert result["diff"] == 0.0 and result["ci_lo"] == 0.0 and result["ci_hi"] == 0.0
    assert result["p_two_sided_share"] == 1.0


def test_paired_difference_detects_a_better_model():
    p_good, y = _model(400, 3, seed=1, skill=3.0)
    p_bad, _ = _model(400, 3, seed=2, skill=0.5, labels=y)
    result = stats.paired_bootstrap_diff("accuracy", p_good, p_bad, y, n_boot=500)
    assert result["diff"] == pytest.approx(metrics.accuracy(p_good, y) - metrics.accuracy(p_bad, y))
    assert 0 < result["ci_lo"] < result["diff"] < result["ci_hi"]
    assert result["p_two_sided_share"] < 0.01


def test_paired_matrix_equals_pairwise_calls():
    y = _model(250, 3, seed=0)[1]
    models = {f"m{i}": _model(250, 3, seed=10 + i, skill=0.5 * i, labels=y)[0] for i in range(4)}
    table = stats.paired_bootstrap_matrix("ece", models, y, n_boot=150, random_state=4)
    assert len(table) == 6 and table[["model_a", "model_b"]].iloc[0].tolist() == ["m0", "m1"]
    for row in table.itertuples():
        single = stats.paired_bootstrap_diff(
            "ece", models[row.model_a], models[row.model_b], y, n_boot=150, random_state=4
        )
        for key in ("diff", "ci_lo", "ci_hi", "p_two_sided_share"):
            assert getattr(row, key) == pytest.approx(single[key], abs=1e-15)
    ci = stats.bootstrap_ci_table("ece", models, y, n_boot=150, random_state=4)
    assert ci["model"].tolist() == list(models)
    assert (ci["ci_lo"] <= ci["point"]).all() and (ci["point"] <= ci["ci_hi"]).all()


def test_paired_matrix_rejects_mismatched_models():
    p, y = _model(50, 3, seed=0)
    with pytest.raises(FmauditInputError, match="'b'"):
        stats.paired_bootstrap_matrix("accuracy", {"a": p, "b": p[:40]}, y, n_boot=10)


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


# ------------------------------------------------------------------------------------- meta-analysis
def test_fisher_z_hand_made_example():
    # rho = (0.1, 0.5), n = (13, 23): v = (0.1, 0.05), w = (10, 20)
    z1, z2 = math.atanh(0.1), math.atanh(0.5)
    mu_fe = (10 * z1 + 20 * z2) / 30
    q = 10 * (z1 - mu_fe) ** 2 + 20 * (z2 - mu_fe) ** 2
    tau2 = (q - 1) / (30 - (100 + 400) / 30)
    w1, w2 = 1 / (0.1 + tau2), 1 / (0.05 + tau2)
    mu_re = (w1 * z1 + w2 * z2) / (w1 + w2)
    se = math.sqrt(1 / (w1 + w2))
    result = stats.fisher_z_meta([0.1, 0.5], [13, 23])
    assert result["mu_fixed"] == pytest.approx(mu_fe) and result["Q"] == pytest.approx(q)
    assert result["df"] == 1 and result["tau2"] == pytest.approx(tau2)
    assert result["I2"] == pytest.approx((q - 1) / q)
    assert result["pooled_rho"] == pytest.approx(math.tanh(mu_re))
    assert result["ci_lo"] == pytest.approx(math.tanh(mu_re - 1.96 * se))
    assert result["ci_hi"] == pytest.approx(math.tanh(mu_re + 1.96 * se))
    # the same numbers worked by hand to 3 decimals
    assert (round(q, 3), round(tau2, 4), round(result["I2"], 3), round(result["pooled_rho"], 3)) == (
        1.344, 0.0258, 0.256, 0.363,
    )  # fmt: skip


def test_fisher_z_equal_rhos_have_no_heterogeneity():
    result = stats.fisher_z_meta([0.4, 0.4, 0.4], [10, 50, 200])
    assert result["I2"] == 0.0 and result["tau2"] == 0.0 and result["Q"] == pytest.approx(0.0, abs=1e-24)
    assert result["pooled_rho"] == pytest.approx(0.4)
    assert result["ci_lo"] < 0.4 < result["ci_hi"]


def test_fisher_z_clips_perfect_correlations_and_rejects_small_n():
    result = stats.fisher_z_meta([1.0, 1.0], [10, 10])
    assert result["pooled_rho"] == pytest.approx(0.999)
    with pytest.raises(FmauditInputError, match="exceed 3"):
        stats.fisher_z_meta([0.5, 0.2], [3, 10])
    with pytest.raises(FmauditInputError, match="equal"):
        stats.fisher_z_meta([0.5, 0.2], [10])


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


# --------------------------------------------------------------------------------- structured bootstraps
@pytest.fixture(scope="module")
def transfer_grid():
    rng = np.random.default_rng(0)
    rows = [
        {"model": m, "source": s, "target": t, "auroc": 0.7 + 0.05 * i + 0.02 * rng.normal()}
        for i, m in enumerate(["m1", "m2", "m3"])
        for s in ["h1", "h2", "h3", "h4"]
        for t in ["h1", "h2", "h3", "h4"]
    ]
    return pd.DataFrame(rows)


def test_two_way_cluster_bootstrap(transfer_grid):
    seen = []

    def mean_auroc(frame: pd.DataFrame) -> float:
        seen.append(frame)
        return float(frame["auroc"].mean())

    result = stats.two_way_cluster_bootstrap(transfer_grid, mean_auroc, n_boot=50, random_state=7)
    off_diagonal = transfer_grid[transfer_grid["source"] != transfer_grid["target"]]
    assert result["point"] == pytest.approx(off_diagonal["auroc"].mean())
    assert result["ci_lo"] <= result["point"] <= result["ci_hi"]
    assert result["n_models"] == 3 and result["n_hospitals"] == 4 and result["n_valid"] == 50
    assert len(seen[0]) == len(off_diagonal)
    # first resample: models then hospitals from default_rng(7); every pair of hospital slots with
    # different hospitals, times every model slot
    rng = np.random.default_rng(7)
    model_slots, hospital_slots = rng.integers(0, 3, 3), rng.integers(0, 4, 4)
    n_pairs = int((hospital_slots[:, None] != hospital_slots[None, :]).sum())
    first = seen[1]
    assert len(first) == 3 * n_pairs
    assert (first["source"] != first["target"]).all()
    assert first["model"].value_counts().to_dict() == {
        m: n_pairs * c for m, c in pd.Series(np.array(["m1", "m2", "m3"])[model_slots]).value_counts().items()
    }
    assert {"model_slot", "source_slot", "target_slot"} <= set(first.columns)
    again = stats.two_way_cluster_bootstrap(transfer_grid, lambda f: f["auroc"].mean(), n_boot=50, random_state=7)
    assert again["ci_lo"] == result["ci_lo"] and again["ci_hi"] == result["ci_hi"]


def test_two_way_cluster_bootstrap_bad_input(transfer_grid):
    with pytest.raises(FmauditInputError, match="'hospital'"):
        stats.two_way_cluster_bootstrap(transfer_grid, len, source_col="hospital")


def test_hierarchical_bootstrap_variance_matches_closed_form():
    # balanced two-level design: the bootstrap mean has variance (S_between + mean S_within / m) / n
    rng = np.random.default_rng(1)
    n_enc, m = 6, 5
    enc = np.repeat(np.arange(n_enc), m)
    values = rng.normal(size=n_enc)[enc] + rng.normal(size=n_enc * m) * 2.0
    df = pd.DataFrame({"encoder": enc, "seed": np.tile(np.arange(m), n_enc), "gain": values})
    by_enc = df.groupby("encoder")["gain"]
    expected_var = (by_enc.mean().var(ddof=0) + by_enc.var(ddof=0).mean() / m) / n_enc
    draws = stats.hierarchical_bootstrap_draws(df, ["encoder", "seed"], "gain", n_boot=4000, random_state=0)
    assert draws.var() == pytest.approx(expected_var, rel=0.15)
    assert draws.mean() == pytest.approx(values.mean(), abs=4 * math.sqrt(expected_var / 4000) + 1e-12)


def test_hierarchical_bootstrap_mean_summary():
    rng = np.random.default_rng(2)
    df = pd.DataFrame(
        {
            "encoder": np.repeat(["a", "b", "c", "d"], 12),
            "source_seed": np.tile(np.repeat([0, 1, 2], 4), 4),
            "draw": np.tile(np.arange(4), 12),
            "gain": rng.normal(loc=0.03, scale=0.02, size=48),
        }
    )
    result = stats.hierarchical_bootstrap_mean(df, ["encoder", "source_seed", "draw"], "gain", n_boot=500)
    assert result["point"] == pytest.approx(df["gain"].mean())
    assert result["ci_lo"] < result["point"] < result["ci_hi"]
    assert result["levels"] == ["encoder", "source_seed", "draw"]
    assert result == stats.hierarchical_bootstrap_mean(df, ["encoder", "source_seed", "draw"], "gain", n_boot=500)
    constant = df.assign(gain=0.5)
    flat = stats.hierarchical_bootstrap_mean(constant, ["encoder", "source_seed"], "gain", n_boot=50)
    assert flat["ci_lo"] == pytest.approx(0.5) and flat["ci_hi"] == pytest.approx(0.5)
    with pytest.raises(FmauditInputError, match="missing"):
        stats.hierarchical_bootstrap_mean(df, ["encoder", "hospital"], "gain")
    with pytest.raises(FmauditInputError, match="NaN"):
        stats.hierarchical_bootstrap_mean(df.assign(gain=np.nan), ["encoder"], "gain")
