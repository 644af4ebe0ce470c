"""Workflows through profiles/slurm on a real one-node Slurm cluster (tests/cluster/slurm_up.sh).

The node has one fake GPU (a /dev/null link), so a job that asks for a GPU gets
CUDA_VISIBLE_DEVICES and a gres/gpu allocation from Slurm itself.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CLUSTER_DIR = Path(__file__).resolve().parent
REPO_ROOT = CLUSTER_DIR.parents[1]

DEMO_SNAKEFILE = REPO_ROOT / "Snakefile"
# Everything a copy of the repository needs to run the demo, minus outputs and environments.
DEMO_COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", ".snakemake", "results", "__pycache__", ".pytest_cache", "*.egg-info"
)


def _key_values(text: str) -> dict[str, str]:
    """`KEY=value` pairs of the job's `echo` lines (first occurrence wins)."""
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([A-Za-z_]+)=(\S*)", line.strip())
        if match:
            pairs.setdefault(match.group(1), match.group(2))
    return pairs


def test_mini_workflow_runs_embed_on_a_slurm_gpu(run_on_slurm, tmp_path):
    workdir = tmp_path / "mini"
    shutil.copytree(CLUSTER_DIR / "mini", workdir)

    run = run_on_slurm(workdir, "--directory", str(workdir), timeout_s=240)

    assert run.returncode == 0, run.failure_message()
    by_rule = {submission.rule: submission for submission in run.submissions}
    assert set(by_rule) == {"embed", "summarize"}, run.submissions
    assert "--gpus=1" in by_rule["embed"].command_line.split()
    assert "--gpus" not in by_rule["summarize"].command_line

    embed_report = (workdir / "results" / "embed_job.txt").read_text()
    embed_env = _key_values(embed_report)
    assert embed_env["SLURM_JOB_ID"] == by_rule["embed"].job_id.split(";")[0]
    assert embed_env["CUDA_VISIBLE_DEVICES"] == "0"
    # Slurm's own record of the job: the GPU it was asked for and the rule the plugin named.
    assert re.search(r"\bTresPerJob=\S*gres[:/]gpu[:=]1\b", embed_report), embed_report
    assert re.search(r"\bComment=rule_embed\b", embed_report), embed_report

    summary = _key_values((workdir / "results" / "summary.txt").read_text())
    assert summary["SLURM_JOB_ID"] == by_rule["summarize"].job_id.split(";")[0]
    assert int(summary["embed_lines"]) == len(embed_report.splitlines())


@pytest.mark.skipif(not DEMO_SNAKEFILE.exists(), reason="demo workflow not available")
def test_demo_workflow_on_slurm_requests_gpus_for_embedding(run_on_slurm, tmp_path):
    workdir = tmp_path / "demo"
    shutil.copytree(REPO_ROOT, workdir, ignore=DEMO_COPY_IGNORE)

    run = run_on_slurm(
        workdir,
        "--snakefile", str(workdir / "Snakefile"),
        "--configfile", str(workdir / "config.yaml"),
        "--directory", str(workdir),
        "report",
        timeout_s=1200,
    )  # fmt: skip

    assert run.returncode == 0, run.failure_message()
    embed_submissions = [s for s in run.submissions if s.rule == "embed"]
    assert embed_submissions, f"no embed job went to Slurm: {run.submissions}"
    for submission in embed_submissions:
        assert "--gpus=1" in submission.command_line.split(), submission.command_line
    embed_logs = list((workdir / ".snakemake" / "slurm_logs" / "rule_embed").rglob("*.log"))
    assert len(embed_logs) == len(embed_submissions)
    report_dir = workdir / "results" / "report"
    assert report_dir.is_dir() and any(report_dir.iterdir())
