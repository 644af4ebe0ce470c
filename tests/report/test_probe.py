"""The probe section formats the probe-suite summary: markdown tables, figures, the settings in words."""

import pandas as pd
import pytest

from fmaudit.analyses.probe_summary import summarize_probe_suite
from fmaudit.report import probe
from fmaudit.report.section import ReportWriter


@pytest.fixture(scope="module")
def summary(suite_results):
    rows, preds = suite_results
    return summarize_probe_suite(rows, preds, {"t": {"ece_bins": 15}},
                                 {"t": {"n_boot": 30, "seed": 0, "paired_n_boot": 40}})


def test_section_writes_its_tables_figures_and_index_lines(summary, tmp_path):
    writer = ReportWriter(tmp_path)
    lines = probe.write_probe_section(summary, writer)
    assert writer.written == set(probe.SECTION.outputs())
    text = "\n".join(lines)
    assert "15 equal-width bins" in text and "B=30" in text and "B=40" in text
    for name in probe.FIGURES:
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 1000


def test_leaderboard_markdown_one_table_per_source_with_intervals(summary):
    md = probe.leaderboard_markdown(summary["leaderboard"])
    sources = summary["leaderboard"][["task", "head", "fraction", "source_domain"]].drop_duplicates()
    assert md.count("### ") == len(sources)
    best = summary["leaderboard"].iloc[0]
    assert f"{best['macro_f1']:.3f} [{best['macro_f1_ci_lo']:.3f}, {best['macro_f1_ci_hi']:.3f}]" in md


def test_calibration_markdown_uses_the_ece_column_of_the_table(summary):
    md = probe.calibration_markdown(summary["calibration"])
    assert "Top-label ECE (15 bins" in md and "oracle_ts" in md and "kshot_ts (K=4)" in md
    renamed = summary["calibration"].rename(columns={"ece_top_15_lohi": "ece_top_10_lohi"})
    assert "Top-label ECE (10 bins" in probe.calibration_markdown(renamed)


def test_empty_section_says_so(tmp_path):
    writer = ReportWriter(tmp_path)
    assert probe.write_probe_section(None, writer)[0].startswith("No probe runs")
    assert pd.read_csv(tmp_path / "tables" / "cri.csv").columns.tolist() == ["note"]
