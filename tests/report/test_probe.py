"""The probe section formats the probe-suite summary: markdown tables, figures, the settings in words."""

import pandas as pd
import pytest

from fmaudit.analyses.probe_summary import summarize_probe_suite
from fmaudit.config import fill_section
from fmaudit.report import probe
from fmaudit.report.chapter import ReportWriter


@pytest.fixture(scope="module")
def summary(suite_results):
    rows, preds = suite_results
    return summarize_probe_suite(rows, preds, {"t": fill_section("calibration", {"ece_bins": 15})},
                                 {"t": {"n_boot": 30, "seed": 0, "paired_n_boot": 40}})


def test_section_writes_its_tables_figures_and_index_lines(summary, tmp_path):
    writer = ReportWriter(tmp_path)
    lines = probe.write_probe_chapter(summary, writer)
    assert writer.written == set(probe.CHAPTER.outputs())
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
    assert probe.write_probe_chapter(None, writer)[0].startswith("No probe runs")
    assert pd.read_csv(tmp_path / "tables" / "cri.csv").columns.tolist() == ["note"]


def test_index_captions_every_figure_with_its_settings(summary, tmp_path):
    lines = probe.write_probe_chapter(summary, ReportWriter(tmp_path))
    text = "\n".join(lines)
    captions = probe.figure_captions(summary["settings"])
    assert set(captions) == set(probe.FIGURES)
    for name, caption in captions.items():
        assert f"](figures/{name}.png)" in text and f"*{caption}*" in text
    assert "15 equal-width bins" in captions["reliability"] and "B=30" in captions["rank_transfer"]
    assert "B=30" in captions["ece_vs_fraction"] and "test groups" in captions["rank_transfer"]


def test_rank_transfer_markdown_shows_rho_with_its_interval_or_says_why_not(summary):
    rank = summary["rank_transfer"]
    md = probe.rank_transfer_markdown(rank)
    defined = rank.dropna(subset=["spearman_rho_ci_lo"]).iloc[0]
    assert (f"{defined['spearman_rho']:.3f} [{defined['spearman_rho_ci_lo']:.3f}, "
            f"{defined['spearman_rho_ci_hi']:.3f}]") in md
    tied = rank.assign(spearman_rho=float("nan"), spearman_rho_ci_lo=float("nan"))
    assert "n/a (ties)" in probe.rank_transfer_markdown(tied)
    assert "at least two encoders" in probe.rank_transfer_markdown(rank.iloc[0:0])


def test_figures_draw_from_the_computed_data_only(summary, tmp_path):
    """Each figure draws from its table alone (intervals and ECE arrive computed) and degrades to a message."""
    from fmaudit.report import figures

    figures.rank_transfer_heatmap(summary["rank_transfer"].drop(columns=["spearman_rho_ci_lo", "spearman_rho_ci_hi"]),
                                  tmp_path / "no_interval.png")
    figures.rank_transfer_heatmap(summary["rank_transfer"].iloc[0:0], tmp_path / "empty.png")
    curves = summary["ece_by_fraction"]
    figures.ece_vs_fraction_figure(curves.drop(columns=["ece_ci_lo", "ece_ci_hi"]), "ece_top_15_lohi", "ECE",
                                   tmp_path / "no_band.png")
    for name in ("no_interval", "empty", "no_band"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000


def test_leaderboard_headers_name_the_unit_and_count_of_each_target(summary):
    md = probe.leaderboard_markdown(summary["leaderboard"])
    one = summary["leaderboard"].iloc[0]
    assert f"{one['source_domain']} (in-domain; {one['ci_resampling']})" in md
    assert "unit=group, n=" in md and "patient" not in md


def test_interval_units_text_says_item_level_where_there_are_no_patients(summary):
    board = summary["leaderboard"]
    assert probe.interval_units_text(board).startswith("task t: unit=group, n=")
    items = board.assign(ci_unit="item", ci_n_units=18)
    assert probe.interval_units_text(items) == "task t: unit=item, n=18 per test set (no patient ids: item-level)"


def test_a_leaky_split_is_flagged_and_shown_beside_the_other(summary):
    board = summary["leaderboard"].assign(task_split="patch (leaky, as published)")
    assert "**Split: patch (leaky, as published)**" in probe.leaderboard_markdown(board)
    assert "Split:" not in probe.leaderboard_markdown(summary["leaderboard"])
    cri = summary["cri"]
    both = pd.concat([cri.assign(task_split="manifest"), cri.assign(task="t-patch", task_split="patch (leaky, as "
                                                                                                   "published)")])
    md = probe.cri_by_split_markdown(both.assign(datasets="d"))
    assert "ood_stability: patch (leaky, as published) [t-patch]" in md and "ood_stability: manifest [t]" in md
    assert probe.cri_by_split_markdown(summary["cri_by_split"]).startswith("No task is run under two splits")
