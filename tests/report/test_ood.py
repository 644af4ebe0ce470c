"""The OOD report chapter: every declared table and figure, intervals with their unit and count, notes when
nothing ran."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fmaudit.analyses.ood_summary import summarize_ood
from fmaudit.report import ood
from fmaudit.report.chapter import ReportWriter


@pytest.fixture(scope="module")
def ood_results():
    from analyses.test_ood_suite import make_data
    from fmaudit.analyses.ood_suite import run_ood_suite

    data, conditions = make_data()
    res = run_ood_suite(data, conditions, encoder="enc", task="t", readout="cls", probe_C=1.0, n_boot=20,
                        gate_params={"random_state": 0}, gate_splits=1, gate_near=True)
    tables = {"detection": res.detection, "selective": res.selective, "curves": res.curves, "blur": res.blur,
              "gate": res.gate, "histograms": res.histograms}
    return summarize_ood(tables, {"t": {"ordinal": False}})


def test_section_writes_every_output_and_names_interval_units(ood_results, tmp_path):
    writer = ReportWriter(tmp_path)
    lines = ood.write_ood_chapter(ood_results, writer)
    assert writer.written == set(ood.CHAPTER.outputs())
    text = "\n".join(lines)
    assert "### Categorical tasks (t)" in text and "Setting t:holdout_TUM" in text and "Setting t:artefact" in text
    assert "unit=group, n=20" in text and "B=20" in text  # the test data declare no group unit
    gate = pd.read_csv(tmp_path / "tables" / "ood_gate_summary.csv")
    assert {"coverage", "coverage_mean_over_divisions", "coverage_mean_over_divisions_ci_lo", "ci_unit", "ci_n_units",
            "n_boot", "n_splits", "division_strata"} <= set(gate)
    assert pd.read_csv(tmp_path / "tables" / "ood_slides.csv")["note"].iloc[0].startswith("no slide aggregation")
    for name in ood.FIGURES:
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 5000
    tex = (tmp_path / "tables" / "ood_detection.tex").read_text()
    assert "\\begin{tabular}" in tex


def test_no_ood_shard_writes_notes(tmp_path):
    writer = ReportWriter(tmp_path)
    lines = ood.write_ood_chapter(None, writer)
    assert writer.written == set(ood.CHAPTER.outputs())
    assert "No OOD shard was planned" in "\n".join(lines)
    assert pd.read_csv(tmp_path / "tables" / "ood_detection.csv")["note"].iloc[0] == ood.NOTE


def test_markdown_keeps_point_and_interval(ood_results):
    summary = ood_results["gate_summary"]
    md = ood.gate_markdown(summary)
    row = summary[(summary["set"] == "test") & (summary["setting"] == "t")].iloc[0]
    mean = "coverage_mean_over_divisions"
    assert f"| {row['coverage']:.3f} |" in md  # the paper's single division, no interval of its own
    assert f"{row[mean]:.3f} [{row[mean + '_ci_lo']:.3f}, {row[mean + '_ci_hi']:.3f}]" in md
    assert "n/a (no labels)" in md  # the far set has no labels
    assert np.isfinite(summary["tau_novelty"]).all()
