"""The report writes exactly what its sections declare, formats what it is given, and computes nothing."""

import ast
from pathlib import Path

import pandas as pd
import pytest

from fmaudit.report import CHAPTERS, Chapter, report_outputs, write_report
from fmaudit.report.chapter import ReportWriter

REPORT_SRC = Path(__file__).resolve().parents[2] / "src" / "fmaudit" / "report"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_outputs_are_the_sections_declarations():
    outputs = report_outputs()
    assert list(outputs["tables"]) == ["report_lint"] + [t for s in CHAPTERS for t in s.tables]
    assert outputs["tables"]["leaderboard"] == "Accuracy under shift"
    assert outputs["tables"]["embeddings"] == "Provenance"
    assert set(outputs["figures"]) == {"reliability", "rank_transfer", "ece_vs_fraction", "ood_risk_coverage",
                                       "ood_score_histograms", "ood_blur_accuracy", "prior_shift_gains",
                                       "cell_cra_crt_landscape", "cell_qc_overlays", "card_rank_bump", "card_ece_vs_k",
                                       "card_risk_coverage"}
    assert outputs["tables"]["ood_gate"] == "Abstention gate"


def test_a_config_without_probe_runs_still_writes_every_declared_output(tmp_path):
    inventory = pd.DataFrame({"encoder": ["e"], "dataset": ["d"], "n_items": [3]})
    write_report(tmp_path, {"probe": None, "embeddings": inventory})
    declared = ({p for s in CHAPTERS for p in s.outputs()} | {"index.md", "index.html"}
                | {f"tables/report_lint{ext}" for ext in (".csv", ".md", ".tex")})
    assert _files(tmp_path) == declared
    assert pd.read_csv(tmp_path / "tables" / "leaderboard.csv")["note"].iloc[0].startswith("no probe runs")
    assert pd.read_csv(tmp_path / "tables" / "embeddings.csv")["encoder"].tolist() == ["e"]
    index = (tmp_path / "index.md").read_text()
    assert "No probe runs were planned" in index and "## Embeddings" in index


def test_a_new_section_is_one_module_and_one_registration(tmp_path):
    def write(results, writer: ReportWriter):
        writer.table("drift_scores", pd.DataFrame({"auroc": [results]}))
        return ["## Drift", "", f"AUROC {results}", ""]

    drift = Chapter("drift", {"drift_scores": "Drift"}, {}, write)
    write_report(tmp_path, {"drift": 0.9, "embeddings": None}, chapters=(*CHAPTERS[1:], drift))
    assert "tables/drift_scores.csv" in _files(tmp_path)
    assert "AUROC 0.9" in (tmp_path / "index.md").read_text()
    assert report_outputs((*CHAPTERS, drift))["tables"]["drift_scores"] == "Drift"


def test_sections_must_write_what_they_declare(tmp_path):
    sneaky = Chapter("x", {"declared": "X"}, {}, lambda r, w: w.table("undeclared", pd.DataFrame()) or [])
    with pytest.raises(RuntimeError, match="undeclared"):
        write_report(tmp_path, {}, chapters=(sneaky,))
    assert not (tmp_path / "index.md").exists()  # index.md last: no complete-looking report
    clash = Chapter("y", {"embeddings": "Y"}, {}, lambda r, w: [])
    with pytest.raises(ValueError, match="embeddings"):
        report_outputs((*CHAPTERS, clash))


def test_the_report_imports_no_analysis_and_no_statistics():
    """Compute in analyses/stats, format in report: the report package imports neither."""
    for path in REPORT_SRC.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        upward = [m for m in imported if m.startswith(("fmaudit.analyses", "fmaudit.stats", "fmaudit.jobs"))]
        assert not upward, f"{path.name} imports {upward}"


def test_every_declared_output_has_its_caption():
    captions = Path(__file__).resolve().parents[2] / "resources" / "report"
    outputs = report_outputs()
    for kind in ("tables", "figures"):
        for name in outputs[kind]:
            assert (captions / kind / f"{name}.rst").stat().st_size > 0, f"{kind}/{name}.rst"
    declared = {f"{kind}/{name}.rst" for kind in ("tables", "figures") for name in outputs[kind]}
    # the HTML pages of the report (cards, front page) and the first screen of Snakemake's report
    declared |= {"pages/card.rst", "pages/front_page.rst", "pages/workflow.rst"}
    assert {str(p.relative_to(captions)) for p in captions.rglob("*.rst")} == declared
