"""Formatting helpers: intervals, settings in words, one table in every format."""

import numpy as np
import pandas as pd

from fmaudit.report.formatting import TABLE_FORMATS, ece_columns, fmt_ci, settings_text, write_all_formats


def test_fmt_ci():
    assert fmt_ci(0.8123, 0.79, 0.8333) == "0.812 [0.790, 0.833]"
    assert fmt_ci(np.nan, 0.1, 0.2) == "n/a"


def test_settings_text_names_tasks_only_when_settings_differ():
    one = [({"ece_bins": 15, "n_boot": 200}, ["t1", "t2"])]
    assert settings_text(one) == "15 equal-width bins, B=200"
    two = one + [({"ece_bins": 10, "n_boot": 50}, ["t3"])]
    assert settings_text(two, "B={n_boot}") == "tasks t1, t2: B=200; task t3: B=50"


def test_ece_columns_sorted_by_bins():
    df = pd.DataFrame(columns=["ece_top_15_lohi", "macro_f1", "ece_top_10_lohi", "ece_ci_lo"])
    assert ece_columns(df) == ["ece_top_10_lohi", "ece_top_15_lohi"]


def test_write_all_formats(tmp_path):
    df = pd.DataFrame({"encoder": ["a_b"], "macro_f1": [0.81234]})
    paths = write_all_formats(df, tmp_path / "t")
    assert [p.suffix for p in paths] == list(TABLE_FORMATS)
    pd.testing.assert_frame_equal(pd.read_csv(paths[0]), df)
    assert "| a_b" in paths[1].read_text()
    tex = paths[2].read_text()
    assert r"a\_b" in tex and "0.812" in tex


def test_a_single_test_patient_gives_no_interval_and_fewer_than_five_a_note():
    from fmaudit.report.formatting import guard_intervals

    board = pd.DataFrame({"macro_f1": [1.0, 0.8, 0.7, 0.5], "macro_f1_ci_lo": [1.0, 0.6, 0.6, np.nan],
                          "macro_f1_ci_hi": [1.0, 0.9, 0.8, np.nan], "ci_unit": "patient", "ci_n_units": [1, 3, 12, 0]})
    out, lines = guard_intervals(board)
    assert np.isnan(out.loc[0, "macro_f1_ci_lo"]) and np.isnan(out.loc[0, "macro_f1_ci_hi"])
    assert out.loc[0, "ci_note"] == "no interval: 1 patient (a cluster bootstrap needs at least 2)"
    assert out.loc[1, "macro_f1_ci_lo"] == 0.6 and out.loc[1, "ci_note"].startswith("only 3 patients")
    assert pd.isna(out.loc[2, "ci_note"]) and pd.isna(out.loc[3, "ci_note"])  # enough; none by design
    assert lines == ["1 row(s) without an interval (a single test patient)",
                     "1 row(s) with intervals over 3 patients only (fewer than 5)"]
    assert guard_intervals(board.iloc[2:])[1] == [] and "ci_note" not in guard_intervals(board.iloc[2:])[0]
    assert fmt_ci(1.0, np.nan, np.nan) == "1.000 [no interval]"
