"""The report lint: each check flags a planted problem and stays silent on the fixed table."""

from __future__ import annotations

import pandas as pd
import pytest

from fmaudit.io import write_table
from fmaudit.report.lint import CHECKS, lint_captions, lint_markdown, lint_report, lint_tables, markdown_tables


def _checks(findings) -> set[str]:
    return {f["check"] for f in findings}


def _board(n_units: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "encoder": ["a", "b"],
            "macro_f1": [0.8, 0.7],
            "macro_f1_ci_lo": [0.8, 0.6],
            "macro_f1_ci_hi": [0.8, 0.8],
            "ci_unit": "patient",
            "ci_n_units": n_units,
        }
    )


def test_few_resampling_units():
    found = lint_tables({"leaderboard": _board(1)})
    assert _checks(found) == {"few resampling units"} and "patient: n=1" in found[0]["detail"]
    assert not lint_tables({"leaderboard": _board(5)})
    # the top level of a hierarchical bootstrap over encoders counts too
    hier = pd.DataFrame(
        {
            "method": ["m"],
            "mean": [0.1],
            "ci_lo": [0.0],
            "ci_hi": [0.2],
            "n_encoders": [4],
            "unit": ["encoder > seed > draw (hierarchical bootstrap)"],
        }
    )
    assert _checks(lint_tables({"prior_shift_gains": hier})) == {"few resampling units"}
    assert not lint_tables({"prior_shift_gains": hier.assign(n_encoders=6)})
    # no interval, nothing to flag
    assert not lint_tables({"leaderboard": _board(1).assign(macro_f1_ci_lo=float("nan"), macro_f1_ci_hi=float("nan"))})


def test_detection_auroc_below_chance():
    det = pd.DataFrame(
        {"encoder": ["a", "b"], "scorer": ["energy", "maha"], "tier": ["far", "far"], "auroc": [0.2, 0.95]}
    )
    found = lint_tables({"ood_detection": det})
    assert _checks(found) == {"detection AUROC below 0.5"} and "energy / far: 0.20-0.20 (1 rows)" in found[0]["detail"]
    assert not lint_tables({"ood_detection": det.assign(auroc=[0.6, 0.95])})


def test_blank_cells_and_empty_tables_in_the_index():
    text = (
        "## A\n\nSome caption.\n\n| x | y |\n| --- | --- |\n| 1 |  |\n\n## B\n\n|  |\n|  |\n\n## C\n\n| x |\n| --- |\n"
    )
    found = lint_markdown(text)
    assert _checks(found) == {"blank cell", "empty table"}
    assert any(f["where"] == 'index.md, under "A"' and "columns y" in f["detail"] for f in found)
    assert sum(f["check"] == "empty table" for f in found) == 2
    fixed = "## A\n\n| x | y |\n| --- | --- |\n| 1 | n/a (no run) |\n\n## B\n\nNo rows: nothing was planned.\n"
    assert not lint_markdown(fixed)
    assert _checks(lint_markdown("| x | y |\n| --- | --- |\n| None | nan |\n")) == {"blank cell"}


def test_a_caption_that_names_a_row_or_column_the_table_lacks():
    text = (
        "## T\n\nWith the ResNet-18 trained from scratch as a non-frozen reference row; the `rank_on_target` column "
        "ranks.\n\n| model | macro_f1 |\n| --- | --- |\n| enc-a | 0.8 |\n"
    )
    found = lint_markdown(text)
    assert _checks(found) == {"caption names what the table lacks"}
    assert "row 'ResNet-18'" in found[0]["detail"] and "column 'rank_on_target'" in found[0]["detail"]
    ok = text.replace("| enc-a | 0.8 |", "| ResNet-18 | 0.7 |").replace(
        "| model | macro_f1 |", "| model | rank_on_target |"
    )
    assert not lint_markdown(ok)


def test_rst_captions_are_checked_against_their_table_and_conditional_text_is_not(tmp_path):
    (tmp_path / "transfer_reference.rst").write_text("The ResNet-18 trained from scratch is the reference row.")
    table = pd.DataFrame({"model": ["enc-a"], "macro_f1": [0.8]})
    assert _checks(lint_captions({"transfer_reference": table}, tmp_path)) == {"caption names what the table lacks"}
    (tmp_path / "transfer_reference.rst").write_text(
        "Rows: {% if snakemake.params.x %}the ResNet-18 reference row{% else %}frozen encoders only{% endif %}."
    )
    assert not lint_captions({"transfer_reference": table}, tmp_path)


def test_lint_report_reads_the_written_tables(tmp_path):
    write_table(tmp_path / "tables" / "leaderboard.csv", _board(1))
    write_table(tmp_path / "tables" / "report_lint.csv", pd.DataFrame({"note": ["old"]}))  # not linted itself
    findings = lint_report("| x |\n| --- |\n| 1 |\n", tmp_path, captions=tmp_path / "no-captions")
    assert list(findings.columns) == ["check", "where", "detail"]
    assert set(findings["check"]) == {"few resampling units"} and set(findings["check"]) <= set(CHECKS)


def test_markdown_tables_keep_escaped_pipes_in_a_cell():
    tables = markdown_tables("| a | b |\n| --- | --- |\n| x \\| y | z |\n")
    assert tables[0]["rows"] == [["x \\| y", "z"]]


@pytest.mark.parametrize("check", CHECKS)
def test_every_check_has_a_test_here(check):
    from pathlib import Path

    assert check in Path(__file__).read_text()


def test_a_table_file_without_columns_is_an_empty_table(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "cri_by_split.csv").write_text("\n")
    findings = lint_report("", tmp_path, captions=tmp_path)
    assert findings.to_dict("records") == [{"check": "empty table", "where": "tables/cri_by_split.csv",
                                            "detail": "a table file without columns; write a note row saying why "
                                                      "instead."}]
