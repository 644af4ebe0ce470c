"""The workflow's rooms: the Snakefile is a table of contents, each branch's rules and its helpers sit side by side.

`snakemake --lint` (tests/test_workflow.py) flags a file that holds both rules and functions with a regex over
the file's text (snakemake/linting/snakefiles.py: ``rule .+?:`` and ``def .+?:``); these tests hold the same
line without running Snakemake, and name the file.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "rules"
# the regexes of Snakemake's "Mixed rules and functions in same snakefile" lint
RULE_TEXT = re.compile("rule .+?:")
FUNCTION_TEXT = re.compile("def .+?:")
RULE = re.compile(r"^rule (\w+):", re.MULTILINE)


def _branches() -> list[str]:
    return sorted(p.stem for p in RULES.glob("*.smk") if p.stem != "common" and not p.stem.endswith("_helpers"))


def test_the_snakefile_holds_includes_rule_all_and_localrules_only():
    statements = []
    for line in (REPO / "Snakefile").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            statements.append(line.split()[0])
    # (report: the first screen of Snakemake's HTML report, linking the front page and the cards)
    assert set(statements) <= {"include:", "localrules:", "report:", "rule"}, statements
    assert RULE.findall((REPO / "Snakefile").read_text()) == ["all"]
    includes = re.findall(r'^include: "rules/(\w+)\.smk"', (REPO / "Snakefile").read_text(), re.MULTILINE)
    assert includes[0] == "common" and includes[-1] == "report"  # the report reads what every branch registered
    assert sorted(includes[1:]) == _branches()


def test_each_branch_has_rules_only_and_its_helpers_beside_it():
    for branch in _branches():
        rules_text = (RULES / f"{branch}.smk").read_text()
        assert RULE.findall(rules_text), branch
        assert not FUNCTION_TEXT.search(rules_text), f"rules/{branch}.smk defines a function"
        assert "lambda" not in rules_text, f"rules/{branch}.smk has a lambda (name it in its helpers)"
        assert f'include: "{branch}_helpers.smk"' in rules_text, f"rules/{branch}.smk does not include its helpers"
        helpers = RULES / f"{branch}_helpers.smk"
        match = RULE_TEXT.search(helpers.read_text())
        assert match is None, f"{helpers.name} reads as a rule to snakemake --lint: {match.group(0)!r}"
        # Snakemake reads every callable's signature per job; each helpers file records its own once
        assert helpers.read_text().rstrip().endswith("record_signatures(globals())"), helpers.name


def test_common_holds_no_rule():
    text = (RULES / "common.smk").read_text()
    match = RULE_TEXT.search(text)
    assert match is None, f"common.smk reads as a rule to snakemake --lint: {match.group(0)!r}"
