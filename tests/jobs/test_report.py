"""The report job: every declared output, tables computed with the settings given (ECE bins, B)."""

import pandas as pd

from fmaudit.report import SECTIONS

from .conftest import BOOTSTRAP, CALIBRATION


def test_report_job_writes_every_declared_output(job_chain):
    report = job_chain["report"]
    declared = {p for s in SECTIONS for p in s.outputs()} | {"index.md"}
    written = {str(p.relative_to(report)) for p in report.rglob("*") if p.is_file()}
    assert written == declared
    assert "report written to" in (job_chain["logs"] / "report.log").read_text()


def test_report_tables_carry_the_settings(job_chain):
    tables = job_chain["report"] / "tables"
    board = pd.read_csv(tables / "leaderboard.csv")
    assert "ece_top_10_lohi" in board and f"B={BOOTSTRAP['n_boot']}" in board["ci_convention"].iloc[0]
    paired = pd.read_csv(tables / "paired_differences.csv")
    assert (paired["n_boot"] == BOOTSTRAP["paired_n_boot"]).all()
    calibration = pd.read_csv(tables / "calibration.csv")
    assert "ece_top_10_lohi" in calibration and "adaptive_ece_10_equalmass" in calibration
    assert calibration["ece_convention"].str.startswith(f"top-label, {CALIBRATION['ece_bins']} equal-width").all()
    assert "ECE_10" in pd.read_csv(tables / "cri.csv")["cri_convention"].iloc[0]
    index = (job_chain["report"] / "index.md").read_text()
    assert "10 equal-width bins" in index and f"B={BOOTSTRAP['n_boot']}" in index
    assert f"B={BOOTSTRAP['paired_n_boot']}" in index
    inventory = pd.read_csv(tables / "embeddings.csv")
    assert set(inventory["encoder"]) == {"enc-a", "enc-b"}
