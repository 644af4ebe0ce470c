"""The cell section of the report: every declared table and figure written, the CRA table carries the planted
Nuc-over-Mean advantage with its unit and count, and a config without cells writes notes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fmaudit.analyses.cell_summary import main_magnification, summarize_cell_runs
from fmaudit.io import read_table
from fmaudit.report import cells as cells_report
from fmaudit.report import write_report

CHAPTERS = {"a": ["a-1", "a-2", "a-3", "a-4", "a-5"], "b": ["b-1", "b-2", "b-3"]}  # 8: Wilcoxon can reach p < 0.05
ADVANTAGE = {"enc-strong": 0.15, "enc-mid": 0.08, "enc-flat": 0.0}  # Nuc minus Mean, planted


def synthetic_runs(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for enc, adv in ADVANTAGE.items():
        for mag, loss in ((20.0, 0.0), (10.0, 0.1)):
            for tax in ("fine", "coarse"):
                for protocol, units in (("IS", [s for v in CHAPTERS.values() for s in v]),
                                        ("IOCD", [s for v in CHAPTERS.values() for s in v]), ("LOOO", list(CHAPTERS))):
                    for unit in units:
                        organ = unit.split("-")[0]
                        for s in (0, 1):
                            base = 0.5 - loss + rng.normal(scale=0.01)
                            for readout, f1 in (("nuc", base + adv), ("mean", base), ("cls", base - 0.02)):
                                rows.append({"protocol": protocol, "encoder": enc, "magnification": mag, "taxonomy": tax,
                                             "readout": readout, "seed": s, "unit": unit, "organ": organ,
                                             "status": "ok", "macro_f1": f1, "macro_auroc": 0.5 + f1 / 2})
    rows.append({**rows[0], "status": "skipped: fewer than 2 classes among the training cells", "macro_f1": np.nan})
    return pd.DataFrame(rows)


SETTINGS = {"magnifications": [20, 10], "taxonomies": {"fine": "t-fine", "coarse": "t-coarse"},
            "protocols": {"IS": {"seeds": [0, 1]}}, "readouts": ["nuc", "mean", "cls"],
            "pretraining_wsis": {"enc-strong": 100000, "enc-mid": 1000, "enc-flat": None}}


@pytest.fixture
def qc_png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "qc.png"
    plt.imsave(path, np.zeros((20, 20, 3)))
    return path


def test_the_cell_section_writes_every_declared_output(tmp_path, qc_png):
    results = summarize_cell_runs(synthetic_runs(), SETTINGS, {"a-1": str(qc_png), "b-1": str(qc_png)})
    out = tmp_path / "report"
    write_report(out, {"cells": results}, chapters=(cells_report.CHAPTER,))
    for name in cells_report.TABLES:
        for ext in (".csv", ".md", ".tex"):
            assert (out / "tables" / f"{name}{ext}").exists(), name
    for name in cells_report.FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
    cra = pd.read_csv(out / "tables" / "cell_cra.csv")
    fine20 = cra[(cra["taxonomy"] == "fine") & (cra["magnification"] == 20)].set_index("encoder")
    for enc, adv in ADVANTAGE.items():
        assert fine20.loc[enc, "cra_mean_pp"] == pytest.approx(100 * adv, abs=1e-6)
        assert fine20.loc[enc, "n_sections"] == 8 and "n=8" in fine20.loc[enc, "unit"]
    assert fine20.loc["enc-strong", "nuc_beats_mean"] and not fine20.loc["enc-flat", "nuc_beats_mean"]
    assert list(fine20.sort_values("rank").index) == ["enc-strong", "enc-mid", "enc-flat"]
    crt = pd.read_csv(out / "tables" / "cell_crt.csv")
    assert crt["unit"].str.contains("n=").all() and crt["provisional"].all()
    retention = pd.read_csv(out / "tables" / "cell_magnification_retention.csv")
    strong = retention[(retention["encoder"] == "enc-strong") & (retention["taxonomy"] == "fine")].iloc[0]
    assert strong["retention_10x_over_20x_pct"] == pytest.approx(100 * 0.55 / 0.65, rel=0.02)
    wins = pd.read_csv(out / "tables" / "cell_win_matrix.csv")
    assert set(wins.columns) >= {"encoder", "opponent", "p", "win", "n_pairs", "unit"}
    status = pd.read_csv(out / "tables" / "cell_run_status.csv")
    assert status["runs"].sum() == len(synthetic_runs())
    index = (out / "index.md").read_text()
    assert "## Cells (CellPath-Bench)" in index and "CRT (provisional" in index


def test_without_a_cell_branch_every_output_says_so(tmp_path):
    write_report(tmp_path, {}, chapters=(cells_report.CHAPTER,))
    assert read_table(tmp_path / "tables" / "cell_cra.csv")["note"].tolist() == [cells_report.NOTE]
    assert (tmp_path / "figures" / "cell_qc_overlays.png").exists()


def test_one_magnification_has_no_retention_and_the_main_magnification_is_20x_when_present():
    runs = synthetic_runs()
    runs = runs[runs["magnification"] == 20.0]
    results = summarize_cell_runs(runs, {**SETTINGS, "magnifications": [20]}, {})
    assert "note" in results["retention"].columns
    assert main_magnification([40, 20, 10]) == 20.0 and main_magnification([40, 10]) == 40.0
