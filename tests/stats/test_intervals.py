"""Percentile and cluster-bootstrap intervals, paired differences and the seed-mean cell bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_seed_mean_bootstrap_equals_recomputation_on_resampled_items():
    import pandas as pd

    rng = np.random.default_rng(3)
    n, k = 30, 3
    labels = rng.integers(0, k, n)
    groups = np.repeat(np.arange(10), 3).astype(str)
    rows = []
    for seed in (0, 1):
        logits = rng.normal(size=(n, k)) + 2 * np.eye(k)[labels]
        rows.append(pd.DataFrame({"seed": seed, "item_id": [f"i{j}" for j in range(n)], "group": groups,
                                  "label": labels, "logits": list(logits), "temperature_source": 1.5}))
    preds = pd.concat(rows[::-1], ignore_index=True)  # item order of the cell comes from its first rows
    order, y, counts = stats.cell_resample_counts(preds, n_boot=25, random_state=4)
    np.testing.assert_array_equal(counts, stats.bootstrap_counts(n, groups, n_boot=25, random_state=4))
    point, boot = stats.seed_mean_bootstrap(preds, "ece", counts, order, y, temperature_col="temperature_source",
                                            n_bins=10)
    expected_point, expected = [], []
    for _, one in preds.groupby("seed"):
        p = metrics.softmax(np.stack(one["logits"].to_numpy()), temperature=1.5)
        expected_point.append(metrics.ece(p, y, n_bins=10))
        expected.append([metrics.ece(p[np.repeat(np.arange(n), c)], y[np.repeat(np.arange(n), c)], n_bins=10)
                         for c in counts])
    assert point == pytest.approx(np.mean(expected_point), abs=1e-12)
    np.testing.assert_allclose(boot, np.mean(expected, axis=0), atol=1e-12)
