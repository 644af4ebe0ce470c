"""The OOD section's results: detection by tier with categorical and grading tasks apart, gate operating points."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fmaudit.analyses.ood_summary import detection_by_tier, gate_summary, summarize_ood


def _detection():
    rows = []
    for task, conds in (("cat", [("far", "far_x", 0.9), ("near", "holdout_a", 0.6), ("near", "holdout_b", 0.8)]),
                        ("grade", [("near", "holdout_0", 0.55)])):
        for tier, cond, auc in conds:
            for enc, shift in (("e1", 0.0), ("e2", 0.05)):
                rows.append({"encoder": enc, "task": task, "readout": "cls", "tier": tier, "condition": cond,
                             "scorer": "maha", "auroc": auc + shift, "fpr_at_95tpr": 0.5, "n_id": 10, "n_ood": 5})
    return pd.DataFrame(rows)


def test_detection_by_tier_averages_conditions_and_keeps_task_kinds_apart():
    res = summarize_ood({"detection": _detection()}, {"cat": {"ordinal": False}, "grade": {"ordinal": True}})
    det = res["detection"]
    assert det.columns[det.columns.get_loc("task") + 1] == "task_kind"
    assert set(det.loc[det["task"] == "grade", "task_kind"]) == {"grading"}
    tier = res["detection_by_tier"].set_index(["task_kind", "tier", "encoder"])
    assert tier.loc[("categorical", "near", "e1"), "mean_auroc"] == pytest.approx(0.7)
    assert tier.loc[("categorical", "near", "e2"), "n_conditions"] == 2
    assert tier.loc[("grading", "near", "e1"), "mean_auroc"] == pytest.approx(0.55)
    # far before near, the better encoder first within a tier
    cat = res["detection_by_tier"][res["detection_by_tier"]["task_kind"] == "categorical"]
    assert cat["tier"].tolist() == ["far", "far", "near", "near"] and cat["encoder"].tolist()[:2] == ["e2", "e1"]
    assert res["scorer_for_figures"] == "maha"
    assert detection_by_tier(pd.DataFrame()).empty


def test_gate_summary_headline_is_the_single_division_and_the_mean_over_divisions_a_named_second_column():
    """The audit paper reports one fit/validation division: the headline column is the gate of division 0 (`value`), and
    the mean over the divisions with its pooled interval is a second, separately named column."""
    rows = []
    for s, tier, labelled in (("test", "id", True), ("far_x", "far", False)):
        for q, v in (("coverage", 0.7), ("reject_any", 0.3), ("accuracy_accepted", 0.95 if labelled else np.nan)):
            if np.isnan(v):
                continue
            rows.append({"encoder": "e1", "task": "cat", "task_kind": "categorical", "readout": "cls", "setting": "cat",
                         "set": s, "tier": tier, "quantity": q, "value": v, "mean_over_divisions": v + 0.01,
                         "mean_over_divisions_ci_lo": v - 0.1, "mean_over_divisions_ci_hi": v + 0.1, "n_valid": 20,
                         "n_splits": 2, "n_boot": 20, "ci_unit": "group", "ci_n_units": 4, "n_items": 30,
                         "division_strata": "label x domain"})
    for q, v in (("tau_novelty", 12.5), ("tau_confidence", 0.8), ("C", 1.0)):
        rows.append({"encoder": "e1", "task": "cat", "task_kind": "categorical", "readout": "cls", "setting": "cat",
                     "set": "validation", "tier": "validation", "quantity": q, "value": v, "mean_over_divisions": v})
    out = gate_summary(pd.DataFrame(rows)).set_index("set")
    assert out.loc["test", "coverage"] == 0.7
    assert out.loc["test", "coverage_mean_over_divisions"] == pytest.approx(0.71)
    assert out.loc["test", "coverage_mean_over_divisions_ci_lo"] == pytest.approx(0.6)
    assert "coverage_ci_lo" not in out.columns and out.loc["test", "ci_n_units"] == 4
    assert out.loc["test", "division_strata"] == "label x domain"
    assert "accuracy_accepted" in out.columns and np.isnan(out.loc["far_x", "accuracy_accepted"])
    assert out.loc["far_x", "tau_novelty"] == 12.5 and out.loc["test", "gate_C"] == 1.0
