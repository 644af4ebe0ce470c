"""Leaderboards with cluster-bootstrap intervals, paired differences, the calibration ladder and figure data,
checked against direct recomputation from the predictions."""

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import f1_score

from fmaudit import metrics, stats
from fmaudit.analyses import leaderboard as lb


def _cell(preds, encoder, source, target):
    top = preds["fraction"].max()
    return preds[(preds["encoder"] == encoder) & (preds["source_domain"] == source) & (preds["target_domain"] == target)
                 & (preds["fraction"] == top)]


def test_leaderboard_points_are_seed_means_and_intervals_cover_them(suite_results):
    rows, preds = suite_results
    board = lb.leaderboard(rows, preds, n_boot=40, seed=0, ece_bins=10)
    assert "ece_top_10_lohi" in board and "ece_top_15_lohi" not in board
    assert (board["ci_convention"] == "95% percentile, patient/slide cluster bootstrap, B=40, over the seed mean").all()
    r = board[(board["encoder"] == "enc0") & (board["source_domain"] == "a") & (board["target_domain"] == "b")].iloc[0]
    cell = _cell(preds, "enc0", "a", "b")
    f1, ece = [], []
    for _, one in cell.groupby("seed"):
        logits = np.stack(one["logits"].to_numpy()).astype(np.float64)
        f1.append(f1_score(one["label"], logits.argmax(1), average="macro", labels=range(3), zero_division=0))
        ece.append(metrics.ece(metrics.softmax(logits), one["label"].to_numpy(), n_bins=10))
    assert r["macro_f1"] == pytest.approx(np.mean(f1), abs=1e-12)
    assert r["ece_top_10_lohi"] == pytest.approx(np.mean(ece), abs=1e-12)
    assert (board["macro_f1_ci_lo"] <= board["macro_f1"] + 1e-12).all()
    assert (board["macro_f1"] <= board["macro_f1_ci_hi"] + 1e-12).all()
    again = lb.leaderboard(rows, preds, n_boot=40, seed=0, ece_bins=10)
    pd.testing.assert_frame_equal(board, again)
    # the interval is the percentile interval of the seed mean over the cell's group resamples (n_boot, seed)
    full = preds[(preds["encoder"] == "enc0") & (preds["source_domain"] == "a") & (preds["target_domain"] == "b")
                 & (preds["fraction"] == preds["fraction"].max())]
    order, y, counts = stats.cell_resample_counts(full, 40, 0)
    _, boot = stats.seed_mean_bootstrap(full, "ece", counts, order, y, n_bins=10)
    assert (r["ece_ci_lo"], r["ece_ci_hi"]) == stats.percentile_interval(boot)[:2]


def test_paired_differences_against_the_in_domain_best(suite_results):
    rows, preds = suite_results
    board = lb.leaderboard(rows, preds, n_boot=20, seed=0, ece_bins=15)
    paired = lb.paired_differences(board, preds, n_boot=60, seed=0)
    assert (paired["n_boot"] == 60).all()
    ind = board[board["in_domain"] & (board["source_domain"] == "a")]
    best = ind.sort_values(["macro_f1", "encoder"], ascending=[False, True])["encoder"].iloc[0]
    sel = paired[paired["source_domain"] == "a"]
    assert set(sel["reference"]) == {best} and best not in set(sel["encoder"])
    merged = sel.merge(board[["source_domain", "target_domain", "encoder", "macro_f1"]],
                       on=["source_domain", "target_domain", "encoder"])
    ref = board[(board["encoder"] == best) & (board["source_domain"] == "a")].set_index("target_domain")["macro_f1"]
    np.testing.assert_allclose(merged["difference"], merged["macro_f1"] - merged["target_domain"].map(ref), atol=1e-12)
    assert ((paired["ci_lo"] <= paired["difference"] + 1e-12) & (paired["difference"] <= paired["ci_hi"] + 1e-12)).all()


def test_calibration_table_and_shift_summary_name_their_bins(suite_results):
    rows, preds = suite_results
    cal = lb.calibration_table(rows, ece_bins=15)
    assert {"ece_top_15_lohi", "adaptive_ece_15_equalmass", "classwise_ece_15"} <= set(cal.columns)
    assert cal["ece_convention"].iloc[0].startswith("top-label, 15 equal-width bins")
    board = lb.leaderboard(rows, preds, n_boot=20, seed=0, ece_bins=15)
    shift = lb.shift_summary(board, ece_bins=15)
    one = board[board["encoder"] == "enc0"]
    row = shift[shift["encoder"] == "enc0"].iloc[0]
    assert row["ece_off_domain"] == pytest.approx(one.loc[~one["in_domain"], "ece_top_15_lohi"].mean())


def test_reliability_curves_count_every_item_once(suite_results):
    _, preds = suite_results
    curves = lb.reliability_curves(preds, n_bins=10)
    for (enc, part, calib), c in curves.groupby(["encoder", "part", "calibration"]):
        assert len(c) == 10 and c["count"].sum() == c["n_items"].iloc[0]


def test_ece_by_fraction_is_off_domain_seed_means(suite_results):
    rows, _ = suite_results
    data = lb.ece_by_fraction(rows, ece_bins=15)
    assert not data["in_domain"].any() and set(data["fraction"]) == {0.5, 1.0}
