"""The prior-shift section's tables from shard rows: per (task, source), the hema paper's shapes, counted against
independent few-line references."""

import itertools

import numpy as np
import pandas as pd
import pytest

from fmaudit.analyses.prior_shift_summary import TABLES, summarize_prior_shift, transfer_reference
from fmaudit.io import FmauditInputError

ENCODERS, TARGETS, PRIORS, SEEDS, DRAWS = ["e1", "e2", "e3"], ["u", "v"], ["balanced", "skewed"], [0, 1], range(3)
METHODS = ["none", "cbr", "global_standardization", "oracle_restandardization"]
RULES = ["max_marginal_entropy", "max_bbse_accuracy"]
BOOT = {"t": {"n_boot": 80, "seed": 0}, "t2": {"n_boot": 80, "seed": 0}}


def shard_rows(task="t", seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for enc, tgt, prior, sd, d in itertools.product(ENCODERS, TARGETS, PRIORS, SEEDS, DRAWS):
        base = 0.5 + 0.1 * ENCODERS.index(enc) + rng.normal(scale=0.01)
        gains = {"none": 0.0, "cbr": 0.04, "oracle_restandardization": 0.08,
                 "global_standardization": 0.05 if prior == "balanced" else -0.06}
        if enc == "e3" and prior == "skewed":
            gains["cbr"] = -0.02
        for m in METHODS:
            g = gains[m] + (rng.normal(scale=0.002) if m != "none" else 0)
            out.append({"task": task, "encoder": enc, "source_domain": "s", "target_domain": tgt, "prior": prior,
                        "seed": sd, "draw": d, "method": m, "deployable": m != "oracle_restandardization",
                        "macro_f1": base + g, "gain_macro_f1": g, "in_domain_macro_f1": 0.95,
                        "ece_raw": 0.3, "ece_source_t": 0.25, "delta_ece_raw": -g, "delta_ece_source_t": -g,
                        "recall_x": 0.5 + g, "recall_y": 0.6, "marginal_entropy": rng.random(),
                        "mean_entropy": rng.random(), "mean_max_prob": rng.random(),
                        "bbse_estimated_accuracy": rng.random() if m == "none" else np.nan,
                        "ece_convention": "top-label, 15 equal-width bins, (lo,hi]"})
    return pd.DataFrame(out)


def test_every_table_and_the_seeds_counts():
    rows = shard_rows()
    out = summarize_prior_shift(rows, None, None, BOOT, {"t": RULES})
    assert set(TABLES) <= set(out) and out["headline_rules"] == {"t": "max_marginal_entropy"}
    summary = out["prior_shift_summary"].set_index("method")
    # independent count of negative cells: encoder x target x prior means below 0
    cells = rows.groupby(["method", "encoder", "target_domain", "prior"])["gain_macro_f1"].mean()
    for m in ("cbr", "global_standardization"):
        assert summary.loc[m, "negative_cells"] == f"{int((cells[m] < 0).sum())}/{cells[m].size}"
    assert summary.loc["cbr", "negative_cells"] == "2/12"  # e3 under the skewed prior, both targets
    assert summary.loc["global_standardization", "n_positive_scenarios"] == 2  # the balanced scenarios
    oracle = rows[rows["method"] == "oracle_restandardization"]["gain_macro_f1"].mean()
    assert summary.loc["cbr", "share_of_oracle_gain"] == pytest.approx(summary.loc["cbr", "mean"] / oracle)
    assert not summary.loc["oracle_restandardization", "deployable"]
    assert (summary["unit"].str.startswith("encoder > seed > draw")).all() and (summary["n_boot"] == 80).all()
    lo, hi = summary.loc["cbr", ["ci_lo", "ci_hi"]]
    assert lo <= summary.loc["cbr", "mean"] <= hi
    gains = out["prior_shift_gains"].set_index(["method", "prior"])
    assert (gains.loc[("global_standardization", "skewed"), "mean_gain"] < 0
            < gains.loc[("global_standardization", "balanced"), "mean_gain"])
    assert (gains["n_targets"] == 2).all()
    assert len(out["prior_shift_scenarios"]) == len(METHODS) * len(PRIORS) * len(TARGETS)
    by_enc = out["prior_shift_negative_cells"].set_index(["method", "encoder"])
    assert by_enc.loc[("cbr", "e3"), "negative_cells"] == "2/4"
    regret = out["prior_shift_regret"]
    assert set(regret["rule"]) == set(RULES)
    # a BBSE rule scores the unadapted pipeline only; a problem = target x seed x draw per prior
    assert set(regret.loc[regret["rule"] == "max_bbse_accuracy", "method"]) == {"none"}
    assert (regret["n_problems"] == len(TARGETS) * len(SEEDS) * len(DRAWS)).all()
    recall = out["prior_shift_recall"]
    assert set(recall["class"]) == {"x", "y"}
    assert set(out["prior_shift_calibration"].columns) >= {"ece_raw", "ece_source_t", "delta_ece_raw"}


def test_tasks_and_sources_are_summarised_apart():
    rows = pd.concat([shard_rows("t"), shard_rows("t2", seed=1).assign(recall_z=0.1).drop(columns="recall_x")])
    out = summarize_prior_shift(rows, None, None, BOOT, {"t": RULES, "t2": RULES[:1]})
    summary = out["prior_shift_summary"]
    assert summary.groupby("task").size().to_dict() == {"t": len(METHODS), "t2": len(METHODS)}
    assert (summary["n_encoders"] == 3).all()
    recall = out["prior_shift_recall"]
    assert set(recall.loc[recall["task"] == "t2", "class"]) == {"y", "z"}  # no column of the other task
    assert set(out["prior_shift_regret"].query("task == 't2'")["rule"]) == {"max_marginal_entropy"}


def test_missing_settings_and_empty_rows():
    assert summarize_prior_shift(pd.DataFrame(), None, None, BOOT, {}) is None
    with pytest.raises(FmauditInputError, match="task 't'"):
        summarize_prior_shift(shard_rows(), None, None, {}, {"t": RULES})


def test_transfer_reference_ranks_frozen_encoders_and_keeps_the_reference_apart():
    pool = pd.DataFrame({"task": "t", "encoder": ["a", "b", "c", "a", "b", "c"], "source_domain": "s",
                         "target_domain": "u", "seed": [0, 0, 0, 1, 1, 1],
                         "in_domain_macro_f1": [0.9, 0.95, 0.97] * 2, "macro_f1": [0.5, 0.7, 0.6, 0.5, 0.7, 0.6]})
    scratch = pd.DataFrame({"task": "t", "model": "resnet18-scratch", "frozen": False, "source_domain": "s",
                            "target_domain": ["s", "u"], "in_domain": [True, False], "seed": 0,
                            "macro_f1": [0.85, 0.3]})
    ref = transfer_reference(pool, scratch).set_index("model")
    assert ref.loc[["b", "c", "a"], "rank_on_target"].tolist() == [1, 2, 3]
    assert pd.isna(ref.loc["resnet18-scratch", "rank_on_target"])  # the reference is not ranked
    assert list(ref.index) == ["b", "c", "a", "resnet18-scratch"]
    assert ref.loc["resnet18-scratch", "in_domain_macro_f1"] == pytest.approx(0.85)
    assert ref.loc["resnet18-scratch", "relative_gap"] == pytest.approx((0.85 - 0.3) / 0.85)
    assert ref["n_seeds"].tolist() == [2, 2, 2, 1]
    assert np.isfinite(ref["effective_robustness"]).all()
    assert transfer_reference(pd.DataFrame()).empty
