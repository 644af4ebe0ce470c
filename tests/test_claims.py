"""The paper check: claims files load and name real report tables; a claim is reproduced, not reproduced (a planted
table that breaks it) or not computable (with why); the report chapter and `fmaudit check-claims` agree."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from fmaudit.claims import (
    NOT_COMPUTABLE,
    NOT_REPRODUCED,
    QUANTITIES,
    REPRODUCED,
    ResultTables,
    check_claims,
    claims_path,
    load_claims,
)
from fmaudit.cli import main
from fmaudit.io import FmauditInputError
from fmaudit.report import report_outputs, write_report
from fmaudit.report.paper_check import CHAPTER

PRESETS = ["hema", "prism", "cellpath", "audit", "demo"]


def _tables(args):
    """Every table a claim's arguments read (nested minuend/subtrahend included)."""
    out = []
    for key, value in args.items():
        if key == "table":
            out.append(value)
        elif isinstance(value, dict):
            out += _tables(value)
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_every_claims_file_loads_quotes_its_paper_and_reads_declared_report_tables(preset):
    claims = load_claims(claims_path(preset))
    assert claims.paper == preset and len(claims.claims) >= 7
    declared = set(report_outputs()["tables"])
    readers = {"target_rank_of_in_domain_best": ["cross_domain_leaderboard"],
               "prior_shift_negative_cell_share": ["prior_shift_summary"],
               "temperature_scaling_fails_share": ["calibration"]}
    for c in claims.claims:
        assert c.quote and c.quantity in QUANTITIES
        tables = _tables(dict(c.args)) + readers.get(c.quantity, [])
        assert tables and set(tables) <= declared, (c.id, tables)
        if preset == "demo":
            assert "direction" in c.reproduced and c.published is None  # the demo states no published number


def _write(folder, name, rows):
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / f"{name}.csv", index=False)


def test_a_planted_table_that_breaks_a_claim_is_reported_not_reproduced(tmp_path):
    demo = load_claims(claims_path("demo"))
    good, bad = tmp_path / "good", tmp_path / "bad"
    row = {"task": "demo-tissue", "head": "logistic", "encoder": "e1"}
    _write(good, "shift_summary", [{**row, "macro_f1_in_domain": 0.9, "macro_f1_off_domain": 0.6,
                                    "ece_in_domain": 0.05, "ece_off_domain": 0.20}])
    # planted: the off-domain score above the in-domain one, the claim's direction broken
    _write(bad, "shift_summary", [{**row, "macro_f1_in_domain": 0.6, "macro_f1_off_domain": 0.9,
                                   "ece_in_domain": 0.05, "ece_off_domain": 0.20}])
    ok = check_claims(demo, good).set_index("claim")
    broken = check_claims(demo, bad).set_index("claim")
    assert ok.loc["in-domain-above-off-domain", "status"] == REPRODUCED
    assert ok.loc["in-domain-above-off-domain", "value"] == pytest.approx(0.3)
    assert broken.loc["in-domain-above-off-domain", "status"] == NOT_REPRODUCED
    assert broken.loc["in-domain-above-off-domain", "value"] == pytest.approx(-0.3)
    assert broken.loc["ece-rises-off-domain", "status"] == REPRODUCED
    # tables the run did not write: not computable, saying which
    assert broken.loc["nuc-above-mean", "status"] == NOT_COMPUTABLE
    assert "table cell_cra was not written" in broken.loc["nuc-above-mean", "why"]


def test_not_computable_says_why_and_a_single_row_keeps_its_interval(tmp_path):
    folder = tmp_path / "tables"
    _write(folder, "cell_cra", [{"note": "no cell-level runs were planned by this config"}])
    _write(folder, "rank_transfer", [
        {"task": "hema-wbc5", "head": "logistic", "fraction": 1.0, "metric": "macro_f1",
         "source_domain": "bloodmnist-wbc5", "target_domain": "mll23-wbc5", "spearman_rho": 0.31,
         "spearman_rho_ci_lo": 0.02, "spearman_rho_ci_hi": 0.6, "dethroned": True},
        {"task": "hema-wbc5", "head": "logistic", "fraction": 1.0, "metric": "macro_f1",
         "source_domain": "bloodmnist-wbc5", "target_domain": "raabin-wbc", "spearman_rho": np.nan,
         "spearman_rho_ci_lo": np.nan, "spearman_rho_ci_hi": np.nan, "dethroned": False}])
    hema = check_claims(load_claims(claims_path("hema")), folder).set_index("claim")
    rho = hema.loc["rank-transfer-mll23"]
    assert rho["status"] == REPRODUCED and rho["value"] == 0.31
    assert (rho["value_interval_lo"], rho["value_interval_hi"]) == (0.02, 0.6)
    assert rho["published"] == 0.27 and rho["criterion"] == "|value - published| <= 0.25"
    assert hema.loc["in-domain-best-dethroned-8-of-12", "value"] == 1
    assert hema.loc["in-domain-best-dethroned-8-of-12", "status"] == NOT_REPRODUCED  # 1 of 2 pairs, not 8 +- 3
    demo = check_claims(load_claims(claims_path("demo")), folder).set_index("claim")
    assert demo.loc["nuc-above-mean", "why"] == "table cell_cra: no cell-level runs were planned by this config"
    tables = ResultTables(folder)
    from fmaudit.claims import table_statistic

    with pytest.raises(Exception, match="no row of table rank_transfer has head=1nn"):
        table_statistic(tables, "rank_transfer", "spearman_rho", where={"head": "1nn"})


def _claims_file(tmp_path, claim, **top):
    path = tmp_path / "x.claims.yaml"
    path.write_text(yaml.safe_dump({"paper": "x", **top, "claims": [claim]}))
    return path


BASE = {"id": "c1", "quote": "q", "quantity": "table_statistic",
        "args": {"table": "leaderboard", "column": "macro_f1"}, "published": 0.5, "reproduced": {"tolerance": 0.1}}


@pytest.mark.parametrize("change,message", [
    ({"quantity": "magic"}, "unknown quantity 'magic'"),
    ({"args": {"table": "leaderboard", "columns": "x"}}, "arguments of table_statistic"),
    ({"published": None}, "needs the published value"),
    ({"reproduced": {"direction": ">"}}, "does not match its schema"),
    ({"id": "Bad Id"}, "does not match its schema"),
])
def test_a_bad_claims_file_is_refused_naming_the_claim(tmp_path, change, message):
    with pytest.raises(FmauditInputError, match=message) as err:
        load_claims(_claims_file(tmp_path, {**BASE, **change}))
    assert "x.claims.yaml" in str(err.value)


def test_the_report_chapter_and_the_command_line_give_the_same_verdicts(tmp_path, capsys):
    out = tmp_path / "report"
    _write(out / "tables", "shift_summary", [{"task": "demo-tissue", "head": "logistic", "encoder": "e1",
                                              "macro_f1_in_domain": 0.6, "macro_f1_off_domain": 0.9,
                                              "ece_in_domain": 0.05, "ece_off_domain": 0.2}])
    write_report(out, {"paper_check": [load_claims(claims_path("demo"))]}, chapters=(CHAPTER,))
    table = pd.read_csv(out / "tables" / "paper_check.csv")
    assert len(table) == 7 and set(table["status"]) == {REPRODUCED, NOT_REPRODUCED, NOT_COMPUTABLE}
    index = (out / "index.md").read_text()
    assert "## Paper check" in index and "1 reproduced, 1 not reproduced, 5 not computable" in index
    assert main(["check-claims", "--preset", "demo", "--tables", str(out / "tables"),
                 "--out", str(tmp_path / "check.csv")]) == 0
    again = pd.read_csv(tmp_path / "check.csv")
    pd.testing.assert_series_equal(again["status"], table["status"])
    assert "in-domain-above-off-domain: not reproduced" in capsys.readouterr().out
    assert main(["check-claims", "--preset", "demo", "--results", str(tmp_path), "--strict"]) == 1
    assert main(["check-claims", "--preset", "nope", "--tables", str(out / "tables")]) == 2
    empty = tmp_path / "empty"
    write_report(empty, {}, chapters=(CHAPTER,))
    assert pd.read_csv(empty / "tables" / "paper_check.csv")["note"].iloc[0].startswith("no claims file")
