"""The probe suite's summary: every table, computed per group of tasks that share their settings."""

import pandas as pd
import pytest

from fmaudit.analyses.probe_summary import FIGURE_DATA, TABLES, settings_groups, summarize_probe_suite
from fmaudit.io import FmauditInputError

BOOT = {"n_boot": 20, "seed": 0, "paired_n_boot": 30}


def test_every_table_with_the_settings_of_its_task(suite_results):
    rows, preds = suite_results
    out = summarize_probe_suite(rows, preds, {"t": {"ece_bins": 15}}, {"t": BOOT})
    assert set(out) == {*TABLES, *FIGURE_DATA, "settings"}
    assert out["settings"] == [({"ece_bins": 15, "n_boot": 20, "seed": 0, "paired_n_boot": 30}, ["t"])]
    assert (out["paired_differences"]["n_boot"] == 30).all()
    assert summarize_probe_suite(rows.iloc[:0], preds, {}, {}) is None


def test_tasks_with_other_settings_are_summarised_apart(suite_results):
    rows, preds = suite_results
    rows2 = rows.assign(task="t2").rename(columns={"ece_top_15_lohi": "ece_top_10_lohi",
                                                   "adaptive_ece_15_equalmass": "adaptive_ece_10_equalmass",
                                                   "classwise_ece_15": "classwise_ece_10", "mce_15": "mce_10"})
    both_rows, both_preds = pd.concat([rows, rows2]), pd.concat([preds, preds.assign(task="t2")])
    out = summarize_probe_suite(both_rows, both_preds, {"t": {"ece_bins": 15}, "t2": {"ece_bins": 10}},
                                {"t": BOOT, "t2": {**BOOT, "n_boot": 25}})
    assert [tasks for _, tasks in out["settings"]] == [["t"], ["t2"]]
    board = out["leaderboard"].set_index("task")
    assert board.loc["t", "ci_convention"].str.contains("B=20").all()
    assert board.loc["t2", "ci_convention"].str.contains("B=25").all()
    assert board.loc["t", "ece_top_15_lohi"].notna().all() and board.loc["t2", "ece_top_10_lohi"].notna().all()
    assert set(out["reliability_curves"]["tasks"]) == {"t", "t2"}


def test_a_task_without_settings_is_an_error():
    with pytest.raises(FmauditInputError, match="'t9'"):
        settings_groups(["t9"], {}, {})
