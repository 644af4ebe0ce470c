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
    assert (board["ci_convention"] == "95% percentile, cluster bootstrap of each row's unit (ci_resampling), B=40, "
                                      "over the seed mean").all()
    # the synthetic suite's groups carry no declared unit: they are called groups, with their count
    assert (board["ci_unit"] == "group").all() and board["ci_resampling"].str.match(r"^unit=group, n=\d+$").all()
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


def test_paired_differences_against_the_validation_best(suite_results):
    rows, preds = suite_results
    board = lb.leaderboard(rows, preds, n_boot=20, seed=0, ece_bins=15)
    paired = lb.paired_differences(board, preds, n_boot=60, seed=0)
    assert (paired["n_boot"] == 60).all()
    ind = board[board["in_domain"] & (board["source_domain"] == "a")]
    best = ind.sort_values(["source_val_macro_f1", "encoder"], ascending=[False, True])["encoder"].iloc[0]
    assert (paired["reference_chosen_on"] == "macro-F1 on the source validation split, mean over seeds").all()
    sel = paired[paired["source_domain"] == "a"]
    assert set(sel["reference"]) == {best} and best not in set(sel["encoder"])
    merged = sel.merge(board[["source_domain", "target_domain", "encoder", "macro_f1"]],
                       on=["source_domain", "target_domain", "encoder"])
    ref = board[(board["encoder"] == best) & (board["source_domain"] == "a")].set_index("target_domain")["macro_f1"]
    np.testing.assert_allclose(merged["difference"], merged["macro_f1"] - merged["target_domain"].map(ref), atol=1e-12)
    assert ((paired["ci_lo"] <= paired["difference"] + 1e-12) & (paired["difference"] <= paired["ci_hi"] + 1e-12)).all()


def test_calibration_table_and_shift_summary_name_their_bins(suite_results):
    rows, preds = suite_results
    cal = lb.calibration_table(rows, ece_bins=15, include_bound_temperatures=True)
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
    for _, c in curves.groupby(["encoder", "part", "calibration"]):
        assert len(c) == 10 and c["count"].sum() == c["n_items"].iloc[0]
        # the ECE of the panel is the count-weighted gap of its bins
        filled = c[c["count"] > 0]
        gap = (filled["count"] * (filled["accuracy"] - filled["confidence"]).abs()).sum() / filled["count"].sum()
        assert c["ece"].nunique() == 1 and c["ece"].iloc[0] == pytest.approx(gap, abs=1e-9)


def test_ece_by_fraction_is_off_domain_seed_means_with_cluster_intervals(suite_results):
    rows, preds = suite_results
    data = lb.ece_by_fraction(rows, preds, ece_bins=15, n_boot=40, seed=3)
    assert not data["in_domain"].any() and set(data["fraction"]) == {0.5, 1.0}
    assert (data["ece_ci_lo"] < data["ece_ci_hi"]).all() and data["ci_convention"].str.contains("B=40").all()
    # one cell by hand: resample whole patients (np.repeat of the drawn items), ECE per seed, mean over seeds
    r = data.iloc[5]
    cell = preds[(preds["encoder"] == r["encoder"]) & (preds["fraction"] == r["fraction"])
                 & (preds["source_domain"] == r["source_domain"]) & (preds["target_domain"] == r["target_domain"])]
    items = cell.drop_duplicates("item_id").set_index("item_id")
    counts = stats.bootstrap_counts(len(items), groups=items["group"].to_numpy(), n_boot=40, random_state=3)
    draws = []
    for b in range(40):
        per_seed = []
        for _, one in cell.groupby("seed"):
            one = one.set_index("item_id").loc[items.index]
            probs = metrics.softmax(np.stack(one["logits"].to_numpy()).astype(np.float64))
            take = np.repeat(np.arange(len(items)), counts[b])
            per_seed.append(metrics.ece(probs[take], items["label"].to_numpy()[take], n_bins=15))
        draws.append(np.mean(per_seed))
    lo, hi = np.percentile(draws, [2.5, 97.5])
    assert r["ece_ci_lo"] == pytest.approx(lo, abs=1e-9) and r["ece_ci_hi"] == pytest.approx(hi, abs=1e-9)
    raw = rows[(rows["stage"] == "raw") & (rows["encoder"] == r["encoder"]) & (rows["fraction"] == r["fraction"])
               & (rows["source_domain"] == r["source_domain"]) & (rows["target_domain"] == r["target_domain"])]
    assert r["ece_top_15_lohi"] == pytest.approx(raw["ece_top_15_lohi"].mean())  # the point: the runs' seed mean


def test_the_reference_is_chosen_on_validation_not_on_the_evaluated_test_set(suite_results):
    rows, preds = suite_results
    board = lb.leaderboard(rows, preds, n_boot=20, seed=0, ece_bins=15)
    ind = board["in_domain"] & (board["source_domain"] == "a")
    test_best = board[ind].sort_values(["macro_f1", "encoder"], ascending=[False, True])["encoder"].iloc[0]
    # make another encoder the best on validation: it becomes the reference although it is not the test best
    other = sorted(set(board.loc[ind, "encoder"]) - {test_best})[-1]
    rigged = board.copy()
    rigged.loc[ind & (rigged["encoder"] == other), "source_val_macro_f1"] = 2.0
    paired = lb.paired_differences(rigged, preds, n_boot=20, seed=0)
    assert set(paired.loc[paired["source_domain"] == "a", "reference"]) == {other}
    # no validation items anywhere: the training subset decides, still not the test set
    no_val = rigged.assign(source_val_macro_f1=np.nan)
    chosen, words = lb.reference_encoder(no_val[ind])
    assert words.startswith("macro-F1 on the source training subset")
    assert chosen == no_val[ind].sort_values(["source_train_macro_f1", "encoder"],
                                             ascending=[False, True])["encoder"].iloc[0]
    assert lb.reference_encoder(no_val[ind].drop(columns=["source_train_macro_f1"])) is None


def test_paired_rows_name_their_unit(suite_results):
    rows, preds = suite_results
    board = lb.leaderboard(rows, preds, n_boot=20, seed=0, ece_bins=15)
    paired = lb.paired_differences(board, preds, n_boot=20, seed=0)
    assert paired["ci_resampling"].str.match(r"^unit=group, n=\d+$").all()


def _bound_runs(rows: pd.DataFrame) -> pd.DataFrame:
    """The suite's rows with no temperature at a bound but every source temperature of enc0 (ECE 1.0 there)."""
    rigged = rows.assign(temperature_at_bound=False)
    at = (rigged["encoder"] == "enc0") & (rigged["stage"] == "source_ts")
    rigged.loc[at, "temperature_at_bound"] = True
    rigged.loc[at, "ece_top_15_lohi"] = 1.0
    return rigged


def test_calibration_means_leave_out_bound_temperatures_unless_asked(suite_results):
    rows, _ = suite_results
    rigged = _bound_runs(rows)
    out = lb.calibration_table(rigged, ece_bins=15, include_bound_temperatures=False)
    enc0 = out[(out["encoder"] == "enc0") & (out["stage"] == "source_ts")]
    assert enc0["ece_top_15_lohi"].isna().all() and (enc0["n_at_bound"] == enc0["n_temperatures"]).all()
    assert (out["bound_temperatures"].str.startswith("temperatures at a bound left out")).all()
    kept = lb.calibration_table(rigged, ece_bins=15, include_bound_temperatures=True)
    assert (kept.loc[(kept["encoder"] == "enc0") & (kept["stage"] == "source_ts"), "ece_top_15_lohi"] == 1.0).all()
    other = out[(out["encoder"] == "enc1") & (out["stage"] == "source_ts")]
    assert other["ece_top_15_lohi"].notna().all()
