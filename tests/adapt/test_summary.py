"""The seed's summaries of prior-shift rows: scenario means, hierarchical-bootstrap intervals, negative cells,
effective robustness and relative gap, per-class recall, calibration under adaptation."""

import itertools

import numpy as np
import pandas as pd
import pytest

from fmaudit.adapt import summary as s
from fmaudit.io import FmauditInputError
from fmaudit.stats import hierarchical_bootstrap_mean

ENCODERS = ["e1", "e2", "e3"]
TARGETS = ["u", "v"]
PRIORS = ["balanced", "clinical"]


def rows(seed=0):
    """gain = encoder effect + prior effect + noise; e3 loses under the clinical prior on target v."""
    rng = np.random.default_rng(seed)
    effect = {"e1": 0.05, "e2": 0.03, "e3": 0.0}
    out = []
    for enc, t, p, sd, d in itertools.product(ENCODERS, TARGETS, PRIORS, [0, 1], range(4)):
        gain = effect[enc] + (0.02 if p == "balanced" else -0.01) + rng.normal(scale=0.005)
        if enc == "e3" and t == "v" and p == "clinical":
            gain -= 0.05
        for method, g in (("none", 0.0), ("cbr", gain)):
            out.append({"encoder": enc, "target_domain": t, "prior": p, "seed": sd, "draw": d, "method": method,
                        "gain_macro_f1": g, "macro_f1": 0.6 + g,
                        "in_domain_macro_f1": 0.97 + 0.01 * ENCODERS.index(enc),
                        "ece_raw": 0.3 - g, "ece_source_t": 0.25 - g, "delta_ece_raw": -g, "delta_ece_source_t": -g,
                        "recall_a": 0.5 + g, "recall_b": np.nan if d == 0 else 0.7})
    return pd.DataFrame(out)


def test_scenario_gains_bars_and_dots():
    bars, dots = s.scenario_gains(rows())
    cbr = dots[dots["method"] == "cbr"].set_index(["prior", "target_domain"])["mean_gain"]
    df = rows()
    want = df[df["method"] == "cbr"].groupby(["prior", "target_domain"])["gain_macro_f1"].mean()
    pd.testing.assert_series_equal(cbr.sort_index(), want.sort_index(), check_names=False)
    bar = bars[(bars["method"] == "cbr") & (bars["prior"] == "clinical")].iloc[0]
    assert bar["mean_gain"] == pytest.approx(want.loc["clinical"].mean())
    assert bar["n_targets"] == 2 and bar["n_positive_targets"] == 1


def test_gain_intervals_use_the_hierarchical_bootstrap_and_name_the_unit():
    df = rows()
    out = s.gain_intervals(df, by=["method"], n_boot=300)
    cbr = out[out["method"] == "cbr"].iloc[0]
    ref = hierarchical_bootstrap_mean(df[df["method"] == "cbr"], ["encoder", "seed", "draw"], "gain_macro_f1",
                                      n_boot=300)
    assert cbr["mean"] == pytest.approx(ref["point"]) and cbr["ci_lo"] == pytest.approx(ref["ci_lo"])
    assert cbr["ci_lo"] < cbr["mean"] < cbr["ci_hi"]
    assert cbr["n_scenarios"] == 4 and cbr["n_positive_scenarios"] == 3 and cbr["n_encoders"] == 3
    assert cbr["unit"].startswith("encoder > seed > draw") and cbr["n_boot"] == 300
    # encoders are the outer unit: with three encoders of different effects the interval is wider than a
    # bootstrap that resamples draws only
    cbr_rows = df[df["method"] == "cbr"]
    units = cbr_rows.assign(unit=cbr_rows["encoder"] + cbr_rows["seed"].astype(str) + cbr_rows["draw"].astype(str))
    flat = hierarchical_bootstrap_mean(units, ["unit"], "gain_macro_f1", n_boot=300)
    assert cbr["ci_hi"] - cbr["ci_lo"] > flat["ci_hi"] - flat["ci_lo"]


def test_negative_cells_count_the_seed_way():
    cells = s.negative_cells(rows())
    cbr = cells[cells["method"] == "cbr"]
    assert len(cbr) == 12  # 3 encoders x 2 targets x 2 priors
    counts = s.negative_cell_counts(cells)
    row = counts[counts["method"] == "cbr"].iloc[0]
    # e3 is at -0.01 on every clinical cell and -0.06 on v/clinical: 2 negative cells out of 12
    assert row["negative_cells"] == "2/12" and row["n_negative"] == 2
    assert row["worst_gain"] == pytest.approx(cbr["mean_gain"].min())
    assert "encoder=e3" in row["worst_cell"] and "target_domain=v" in row["worst_cell"]
    by_enc = s.negative_cell_counts(cells, by=["method", "encoder"]).set_index(["method", "encoder"])
    assert by_enc.loc[("cbr", "e3"), "n_negative"] == 2 and by_enc.loc[("cbr", "e1"), "n_negative"] == 0


def test_robustness_relative_gap_and_effective_robustness():
    in_domain = np.array([0.90, 0.93, 0.95, 0.97, 0.98, 0.99])
    # five encoders on a logit-linear trend and d (mid-range, low leverage) 0.08 above it
    x = np.log(in_domain / (1 - in_domain))
    target = 1 / (1 + np.exp(-(0.8 * x - 2.0)))
    target[2] += 0.08
    df = pd.DataFrame({"method": "none", "target_domain": "u", "prior": "balanced",
                       "encoder": ["a", "b", "d", "c", "e", "f"], "in_domain_macro_f1": in_domain, "macro_f1": target})
    out = s.robustness_table(df).set_index("encoder")
    np.testing.assert_allclose(out["relative_gap"], (in_domain - target) / in_domain)
    er = out["effective_robustness"]
    assert er.idxmax() == "d" and er["d"] > 0.04
    assert er.drop("d").abs().max() < er["d"] / 2
    # fewer than three encoders: no fit
    assert s.robustness_table(df.iloc[:2])["effective_robustness"].isna().all()


def test_per_class_recall_and_calibration_tables():
    df = rows()
    rec = s.per_class_recall(df)
    cb = rec[(rec["method"] == "cbr") & (rec["prior"] == "balanced")].set_index("class")["recall"]
    assert cb["b"] == pytest.approx(0.7)  # NaN draws (class absent) are left out
    assert cb["a"] == pytest.approx(0.5 + df[(df.method == "cbr") & (df.prior == "balanced")]["gain_macro_f1"].mean())
    cal = s.calibration_under_adaptation(df)
    assert set(cal.columns) >= {"ece_raw", "ece_source_t", "delta_ece_raw", "delta_ece_source_t"}
    with pytest.raises(FmauditInputError, match="recall_"):
        s.per_class_recall(df.drop(columns=["recall_a", "recall_b"]))
    with pytest.raises(FmauditInputError, match="missing"):
        s.gain_intervals(df.drop(columns="seed"), n_boot=2000)


def test_reference_rows_are_scored_against_the_line_they_do_not_enter():
    in_domain = np.array([0.90, 0.93, 0.95, 0.97])
    x = np.log(in_domain / (1 - in_domain))
    target = 1 / (1 + np.exp(-(0.8 * x - 2.0)))  # four encoders exactly on one logit-linear trend
    df = pd.DataFrame({"target_domain": "u", "encoder": ["a", "b", "c", "d"], "frozen": True,
                       "in_domain_macro_f1": in_domain, "macro_f1": target})
    ref = pd.DataFrame({"target_domain": "u", "encoder": ["scratch"] * 2, "frozen": False,
                        "in_domain_macro_f1": [0.91, 0.91], "macro_f1": [0.10, 0.20]})
    out = s.robustness_table(df, by=["target_domain"], reference_rows=ref).set_index("encoder")
    np.testing.assert_allclose(out.loc[["a", "b", "c", "d"], "effective_robustness"], 0, atol=1e-9)
    # an independent two-line reference: the trend at logit(0.91), against the reference's mean target F1
    expected = 0.15 - 1 / (1 + np.exp(-(0.8 * np.log(0.91 / 0.09) - 2.0)))
    assert out.loc["scratch", "effective_robustness"] == pytest.approx(expected)
    assert out.loc["scratch", "relative_gap"] == pytest.approx((0.91 - 0.15) / 0.91)
    assert out["frozen"].to_dict() == {"a": True, "b": True, "c": True, "d": True, "scratch": False}
    # without the reference rows the frozen encoders' values are the same
    alone = s.robustness_table(df, by=["target_domain"]).set_index("encoder")
    pd.testing.assert_series_equal(alone["effective_robustness"], out.loc[alone.index, "effective_robustness"])
