"""docs/contributing.md's path for a new analysis, without the demo: the toy analysis (tests/toy_analysis.py)
added to a fresh copy of the repository touches exactly the files the guide lists, and is planned by a real
`snakemake -n`, counted by `fmaudit grid` and retried by the cluster profile. tests/test_workflow.py runs it
and sees it reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from toy_analysis import RULE, add_toy_analysis, contributing_files
from workflow_utils import REPO, copy_repo, planned_jobs, snakemake


@pytest.fixture(scope="module")
def toy_copy(tmp_path_factory):
    work = copy_repo(tmp_path_factory.mktemp("toy"))
    return work, add_toy_analysis(work)


def test_the_guide_lists_exactly_the_files_a_new_analysis_touches(toy_copy):
    work, touched = toy_copy
    listed = contributing_files(work / "docs" / "contributing.md")
    assert touched == listed, {"touched, not listed": sorted(touched - listed),
                               "listed, untouched": sorted(listed - touched)}
    assert contributing_files(REPO / "docs" / "contributing.md") == listed


def test_the_toy_analysis_is_planned_counted_and_retried(toy_copy):
    work, _ = toy_copy
    planned = planned_jobs(snakemake(work, "-n").stdout)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    tile_tasks = [t for t, spec in cfg["tasks"].items() if "demo-xenium" not in spec["datasets"]]
    assert planned[RULE] == len(cfg["encoders"]) * len(tile_tasks)
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    out = subprocess.run([sys.executable, "-m", "fmaudit.cli", "grid", "--configfile", "config.yaml", "--json"],
                         cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    [toy] = [row for row in json.loads(out) if row["analysis"] == "toy" and row["protocol"] != "total"]
    assert toy["jobs"] == planned[RULE] and toy["planned"]
    code = "from fmaudit.grid import retried_rules; print(retried_rules())"
    retried = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True,
                             check=True).stdout
    assert RULE in retried
    template = yaml.safe_load((work / "profiles" / "slurm" / "config.yaml").read_text())
    assert template["preemptible-rules"][-1] == RULE


def test_the_toy_analysis_keeps_the_workflow_lint_clean(toy_copy):
    work, _ = toy_copy
    proc = snakemake(work, "--lint", check=False)
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, proc.stdout[-3000:]
