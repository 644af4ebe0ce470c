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
                                rows.append({"protocol": protocol, "encoder": enc, "magnification": mag,
                                             "taxonomy": tax,
                                             "readout": readout, "seed": s, "unit": unit, "organ": organ,
                                             "status": "ok", "macro_f1": f1, "macro_auroc": 0.5 + f1 / 2})
    rows.append({**rows[0], "status": "skipped: fewer than 2 classes among the training cells", "macro_f1": np.nan})
    return pd.DataFrame(rows)


SETTINGS = {"magnifications": [20, 10], "taxonomies": {"fine": "t-fine", "coarse": "t-coarse"},
            "protocols": {"IS": {"seeds": [0, 1]}}, "readouts": ["nuc", "mean", "cls"],
            "pretraining_wsis": {"enc-strong": 100000, "enc-mid": 1000, "enc-flat": None},
            "sections": [s for v in CHAPTERS.values() for s in v],
            "subsets": {"lists": {"S4": ["a-1", "a-2", "b-1", "b-2"], "S8": [s for v in CHAPTERS.values() for s in v]}}}


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
        assert fine20.loc[enc, "n_sections"] == 8 and fine20.loc[enc, "n_balanced"] == 2  # organs a and b
        assert "organs" in fine20.loc[enc, "unit"] and "(unit, seed)" in fine20.loc[enc, "unit"]
    assert fine20.loc["enc-strong", "nuc_beats_mean"] and not fine20.loc["enc-flat", "nuc_beats_mean"]
    assert list(fine20.sort_values("rank").index) == ["enc-strong", "enc-mid", "enc-flat"]
    sections = pd.read_csv(out / "tables" / "cell_cra_sections.csv")
    assert set(sections["balance"]) == {"section"} and (sections["n_balanced"] == 8).all()
    crt = pd.read_csv(out / "tables" / "cell_crt.csv")
    assert crt["unit"].str.contains("n=").all() and {"crt", "crt_relative_pp", "wins_IOCD", "wins_LOOO"} <= set(crt)
    decode = pd.read_csv(out / "tables" / "cell_decodability.csv")
    assert set(decode["protocol"]) == {"IS", "IOCD", "LOOO"} and set(decode["balance"]) == {"organ"}
    assert set(decode.loc[decode["protocol"] == "IS", "readout"]) == {"nuc", "mean"}
    assert set(pd.read_csv(out / "tables" / "cell_decodability_units.csv")["balance"]) == {
        "section", "held-out section", "organ"}
    rho = pd.read_csv(out / "tables" / "cell_taxonomy_consistency.csv")
    assert set(rho["protocol"]) == {"IS", "IOCD", "LOOO"} and "spearman_rho" in rho.columns
    subsets = pd.read_csv(out / "tables" / "cell_subsets.csv")
    assert set(subsets["subset"]) == {"S4", "S8"} and set(subsets.loc[subsets["subset"] == "S4", "n_sections"]) == {4}
    assert "spearman_rho_cra" in pd.read_csv(out / "tables" / "cell_subset_ranks.csv").columns
    retention = pd.read_csv(out / "tables" / "cell_magnification_retention.csv")
    strong = retention[(retention["encoder"] == "enc-strong") & (retention["taxonomy"] == "fine")].iloc[0]
    assert strong["retention_10x_over_20x_pct"] == pytest.approx(100 * 0.55 / 0.65, rel=0.02)
    wins = pd.read_csv(out / "tables" / "cell_win_matrix.csv")
    assert set(wins.columns) >= {"encoder", "opponent", "p", "win", "n_pairs", "unit"}
    status = pd.read_csv(out / "tables" / "cell_run_status.csv")
    assert status["runs"].sum() == len(synthetic_runs())
    index = (out / "index.md").read_text()
    assert "## Cells (CellPath-Bench)" in index and "### CRT" in index and "### Nested section subsets" in index
    assert "### Fine vs coarse taxonomy" in index and "### Decodability per protocol (organ-balanced)" in index


def test_without_a_cell_branch_every_output_says_so(tmp_path):
    write_report(tmp_path, {}, chapters=(cells_report.CHAPTER,))
    assert read_table(tmp_path / "tables" / "cell_cra.csv")["note"].tolist() == [cells_report.NOTE]
    assert (tmp_path / "figures" / "cell_qc_overlays.png").exists()


def test_subsets_from_a_score_table_and_a_note_without_one():
    from fmaudit.analyses.cell_summary import section_subsets

    names = [s for v in CHAPTERS.values() for s in v]
    scores = pd.DataFrame({"section": names, "score": np.linspace(1, 0, len(names))})
    subsets, why = section_subsets({"sizes": [2, 4, 10]}, scores, names)
    assert subsets == {"S2": names[:2], "S4": names[:4]} and why == ""  # S10 needs 10 sections: left out
    none, why = section_subsets({"sizes": [10, 15]}, None, names)
    assert none is None and "cells.subsets.scores" in why
    results = summarize_cell_runs(synthetic_runs(), {**SETTINGS, "subsets": {}}, {})
    assert "cells.subsets" in results["subsets"]["note"].iloc[0]


def test_one_magnification_has_no_retention_and_the_main_magnification_is_20x_when_present():
    runs = synthetic_runs()
    runs = runs[runs["magnification"] == 20.0]
    results = summarize_cell_runs(runs, {**SETTINGS, "magnifications": [20]}, {})
    assert "note" in results["retention"].columns
    assert main_magnification([40, 20, 10]) == 20.0 and main_magnification([40, 10]) == 40.0
