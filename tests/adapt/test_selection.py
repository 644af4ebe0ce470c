"""Label-free encoder selection and its regret against the oracle choice (METHODS 6)."""

import numpy as np
import pandas as pd
import pytest

from fmaudit.adapt.selection import SELECTION_RULES, regret_table, selection_regret
from fmaudit.io import FmauditInputError


def problem_rows():
    """Three encoders on two draws of one balanced and one skewed target, for method none and CBR."""
    rows = []
    # (prior, draw, encoder): macro_f1, marginal_entropy, mean_entropy, mean_max_prob, bbse f1 (none only)
    table = {
        ("balanced", 0): {"a": (0.70, 1.60, 0.50, 0.80, 0.72), "b": (0.60, 1.55, 0.40, 0.85, 0.61),
                          "c": (0.50, 1.40, 0.30, 0.90, 0.49)},
        ("balanced", 1): {"a": (0.68, 1.58, 0.52, 0.79, 0.60), "b": (0.66, 1.59, 0.41, 0.86, 0.65),
                          "c": (0.50, 1.40, 0.30, 0.90, 0.50)},
        ("skewed", 0): {"a": (0.40, 1.50, 0.60, 0.70, 0.45), "b": (0.65, 0.90, 0.30, 0.88, 0.62),
                        "c": (0.55, 1.10, 0.35, 0.86, 0.70)},
        ("skewed", 1): {"a": (0.42, 1.45, 0.61, 0.70, 0.40), "b": (0.61, 0.95, 0.31, 0.88, np.nan),
                        "c": (0.61, 1.20, 0.36, 0.87, 0.55)},
    }
    for (prior, draw), encoders in table.items():
        for method in ("none", "class_balanced_restandardization"):
            for enc, (f1, h_marg, h_mean, conf, bbse) in encoders.items():
                rows.append({"task": "t", "source_domain": "s", "target_domain": "u", "prior": prior, "seed": 0,
                             "draw": draw, "method": method, "encoder": enc, "macro_f1": f1,
                             "marginal_entropy": h_marg, "mean_entropy": h_mean, "mean_max_prob": conf,
                             "bbse_estimated_macro_f1": bbse if method == "none" else np.nan,
                             "bbse_estimated_accuracy": bbse if method == "none" else np.nan})
    # shuffle the rows: nothing may depend on their order
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0).reset_index(drop=True)


def test_regret_per_problem_matches_a_hand_count():
    reg = selection_regret(problem_rows())
    none = reg[reg["method"] == "none"].set_index(["rule", "prior", "draw"])
    # marginal entropy picks a, b, a, a: the oracle's choice on balanced draw 0, small regret on balanced
    # draw 1, large regret on the skewed draws
    assert none.loc[("max_marginal_entropy", "balanced", 0), "selected_encoder"] == "a"
    assert none.loc[("max_marginal_entropy", "balanced", 0), "regret"] == 0.0
    assert none.loc[("max_marginal_entropy", "balanced", 1), "selected_encoder"] == "b"
    assert none.loc[("max_marginal_entropy", "balanced", 1), "regret"] == pytest.approx(0.02)
    assert none.loc[("max_marginal_entropy", "skewed", 0), "regret"] == pytest.approx(0.25)
    assert none.loc[("max_marginal_entropy", "skewed", 1), "regret"] == pytest.approx(0.61 - 0.42)
    # b and c tie on F1 in skewed draw 1: the oracle is the first by name, b
    assert none.loc[("max_marginal_entropy", "skewed", 1), "oracle_encoder"] == "b"
    # min mean entropy and max confidence pick c on balanced draws
    assert none.loc[("min_mean_entropy", "balanced", 0), "selected_encoder"] == "c"
    assert none.loc[("max_mean_max_prob", "balanced", 0), "regret"] == pytest.approx(0.20)
    # BBSE's estimate: b's is NaN in skewed draw 1, so c is picked among a and c
    assert none.loc[("max_bbse_macro_f1", "skewed", 1), "selected_encoder"] == "c"
    assert none.loc[("max_bbse_macro_f1", "skewed", 1), "n_encoders"] == 3
    # BBSE rules are not defined for an adapted pipeline: no rows
    cbr = reg[reg["method"] == "class_balanced_restandardization"]
    assert set(cbr["rule"]) == set(SELECTION_RULES) - {"max_bbse_macro_f1", "max_bbse_accuracy"}
    assert (reg["regret"] >= 0).all()


def test_regret_matches_a_loop_reference():
    rows = problem_rows()
    reg = selection_regret(rows, rules=["max_marginal_entropy"])
    for (prior, draw, method), grp in rows.groupby(["prior", "draw", "method"]):
        grp = grp.sort_values("encoder")
        picked = grp.iloc[int(np.argmax(grp["marginal_entropy"].to_numpy()))]
        want = grp["macro_f1"].max() - picked["macro_f1"]
        got = reg[(reg["prior"] == prior) & (reg["draw"] == draw) & (reg["method"] == method)]["regret"]
        assert got.item() == pytest.approx(want)


def test_regret_table_summarises_per_rule_and_prior():
    table = regret_table(selection_regret(problem_rows(), rules=["max_marginal_entropy"]))
    row = table[(table["method"] == "none") & (table["prior"] == "skewed")].iloc[0]
    assert row["mean_regret"] == pytest.approx((0.25 + 0.19) / 2)
    assert row["n_problems"] == 2 and row["share_oracle_choice"] == 0.0
    bal = table[(table["method"] == "none") & (table["prior"] == "balanced")].iloc[0]
    assert bal["share_oracle_choice"] == 0.5


def test_selection_rejects_bad_tables():
    rows = problem_rows()
    with pytest.raises(FmauditInputError, match="unknown selection rule"):
        selection_regret(rows, rules=["max_accuracy"])
    with pytest.raises(FmauditInputError, match="appears twice"):
        selection_regret(pd.concat([rows, rows.iloc[:1]]))
    with pytest.raises(FmauditInputError, match="needs column"):
        selection_regret(rows.drop(columns="mean_max_prob"), rules=["max_mean_max_prob"])
