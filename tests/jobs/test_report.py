"""The report job: every declared output, tables computed with the settings given (ECE bins, B)."""

import pandas as pd
import pytest

from fmaudit.report import CHAPTERS, report_files

from .conftest import BOOTSTRAP, CALIBRATION


def test_report_job_writes_every_declared_output(job_chain):
    report = job_chain["report"]
    declared = report_files(["enc-a", "enc-b"])
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


def test_every_section_has_a_summary_and_declares_only_known_inputs_and_settings():
    from fmaudit.jobs.report import SUMMARIES
    from fmaudit.report import REPORT_INPUTS, REPORT_SETTINGS, report_reads, report_settings

    assert {s.name for s in CHAPTERS} == set(SUMMARIES)
    assert set(report_reads()) <= set(REPORT_INPUTS) and set(report_settings()) <= set(REPORT_SETTINGS)
    # every declared input and setting is read by some section (none listed for nothing)
    assert set(report_reads()) == set(REPORT_INPUTS) and set(report_settings()) == set(REPORT_SETTINGS)


def test_a_section_sees_only_what_it_declares(job_chain, tmp_path):
    """A section cannot depend on an input or a setting it does not declare: the workflow would not rerun the
    report when that changed."""
    import dataclasses

    from fmaudit.jobs.report import SUMMARIES, report_job
    from fmaudit.report.chapter import Chapter

    seen = {}

    def peek(inputs, settings, earlier):
        seen.update(files=dict(inputs.paths), settings=dict(settings), earlier=set(earlier))
        return None

    def write(results, writer):
        writer.table("peek", pd.DataFrame({"note": ["-"]}))
        return []

    peek_section = Chapter("peek", {"peek": "Test"}, {}, write, reads=("probe_runs",), settings=("bootstrap",))
    probe = next(s for s in CHAPTERS if s.name == "probe")
    inputs = {"probe_runs": [str(job_chain["aggregate"])], "probe_predictions": ["/not/read.parquet"],
              "embeddings": []}
    settings = {"calibration": {"demo": CALIBRATION}, "bootstrap": {"demo": BOOTSTRAP}}
    report_job(inputs, settings, str(tmp_path / "r"), chapters=(peek_section,),
               summaries={"peek": peek, "probe": SUMMARIES["probe"]})
    assert seen["files"] == {"probe_runs": [str(job_chain["aggregate"])]}
    assert seen["settings"] == {"bootstrap": {"demo": BOOTSTRAP}}
    assert seen["earlier"] == set()  # the probe summary is not computed: its section is not in the report

    from fmaudit.report import report_reads

    with pytest.raises(ValueError, match="nothing_listed"):
        report_reads((dataclasses.replace(probe, reads=("nothing_listed",)),))
