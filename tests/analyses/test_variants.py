"""Declared variants beside their base: out of the rankings, paired with their base on the same test items."""

import numpy as np
import pandas as pd

from fmaudit.analyses import leaderboard as lb
from fmaudit.analyses.variants import split_variant_runs, variant_pairs

VARIANTS = {"enc1": "enc0"}  # treat enc1 as a declared variant of enc0


def test_variants_leave_the_ranked_rows(suite_results):
    runs, _ = suite_results
    ranked, paired = split_variant_runs(runs, VARIANTS)
    assert set(ranked["encoder"]) == {"enc0", "enc2", "enc3"}
    assert set(paired["encoder"]) == {"enc0", "enc1"}
    same, empty = split_variant_runs(runs, {})
    assert same is runs and len(empty) == 0


def test_variant_pairs_match_the_leaderboard_and_pair_the_resample(suite_results):
    runs, preds = suite_results
    pairs = variant_pairs(runs, preds, VARIANTS, n_boot=60, seed=0)
    board = lb.leaderboard(runs, preds, n_boot=60, seed=0, ece_bins=15)
    assert len(pairs) == 3 * 3  # 3 sources x 3 targets at the largest fraction, logistic head
    for r in pairs.itertuples():
        cell = board[(board["source_domain"] == r.source_domain) & (board["target_domain"] == r.target_domain)]
        base, var = cell.set_index("encoder").loc["enc0"], cell.set_index("encoder").loc["enc1"]
        assert np.isclose(r.base_macro_f1, base["macro_f1"]) and np.isclose(r.variant_macro_f1, var["macro_f1"])
        assert np.isclose(r.difference, r.variant_macro_f1 - r.base_macro_f1)
        assert r.difference_ci_lo <= r.difference <= r.difference_ci_hi
    assert (pairs["n_boot"] == 60).all() and pairs["unit"].str.contains("paired").all()
    assert (pairs["in_domain"] == (pairs["source_domain"] == pairs["target_domain"])).all()
    # the noisier, more shifted "variant" loses on the shifted targets
    assert (pairs.loc[~pairs["in_domain"], "difference"] < 0).mean() > 0.5
    assert variant_pairs(runs, preds, {"enc9": "enc0"}, n_boot=10, seed=0).empty
    assert variant_pairs(pd.DataFrame(), preds, VARIANTS, n_boot=10, seed=0).empty
