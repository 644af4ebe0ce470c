"""Workflows through profiles/slurm on a real one-node Slurm cluster (tests/cluster/slurm_up.sh).

The node has one fake GPU (a /dev/null link), so a job that asks for a GPU gets
CUDA_VISIBLE_DEVICES and a gres/gpu allocation from Slurm itself. It is in two partitions, `debug`
(the default) and `gpu`, so a test sees where the profile sent each job. The profile is either the
template used directly (--profile profiles/slurm) or installed the way users install it
(`fmaudit profile install slurm ...` into the folder Snakemake searches, then --profile slurm).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_utils import demo_tile_branches

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CLUSTER_DIR = Path(__file__).resolve().parent
REPO_ROOT = CLUSTER_DIR.parents[1]
ACCOUNT = "fmaudit-test"
SLURM_TEST_OVERRIDES = REPO_ROOT / "profiles" / "slurm-test"  # sized for the test node; see its header

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


def fmaudit_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`fmaudit ...` of this source tree, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "fmaudit.cli", *args],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), **env},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def installed_profile(slurm_cluster, tmp_path) -> dict[str, str]:
    """Install the Slurm profile where Snakemake finds `--profile slurm` (a temporary XDG_CONFIG_HOME)."""
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg-config")}
    done = fmaudit_cli("profile", "install", "slurm", "--partition", "debug", "--gpu-partition", "gpu",
                       "--account", ACCOUNT, env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "xdg-config" / "snakemake" / "slurm" / "config.yaml").is_file()
    assert "partition 'debug': ok (sinfo)" in done.stdout
    assert "GPU partition 'gpu': ok (sinfo; up to 1 GPU(s) per node)" in done.stdout
    assert "use it with: snakemake --profile slurm" in done.stdout
    return env


def _option(command_line: str, flag: str) -> str | None:
    tokens = command_line.split()
    return tokens[tokens.index(flag) + 1] if flag in tokens else None


def test_installed_profile_routes_gpu_jobs_and_retries_only_resource_rules(run_on_slurm, installed_profile,
                                                                           tmp_path):
    workdir = tmp_path / "mini"
    shutil.copytree(CLUSTER_DIR / "mini", workdir)
    profiles = ("slurm", SLURM_TEST_OVERRIDES)  # by name, as users type it; the overrides fit the test node

    run = run_on_slurm(workdir, "--directory", str(workdir), "--config", "embed_fails_on_first_attempt=1",
                       profiles=profiles, env=installed_profile)

    assert run.returncode == 0, run.failure_message()
    embeds = [s for s in run.submissions if s.rule == "embed"]
    summaries = [s for s in run.submissions if s.rule == "summarize"]
    assert len(embeds) == 2, run.submissions  # failed once on purpose, resubmitted once
    for submission in embeds:
        assert _option(submission.command_line, "-p") == "gpu", submission.command_line
        assert "--gpus=1" in submission.command_line.split()
        assert _option(submission.command_line, "-A") == ACCOUNT
    assert len(summaries) == 1
    assert _option(summaries[0].command_line, "-p") == "debug", summaries[0].command_line
    assert "--gpus" not in summaries[0].command_line
    assert _option(summaries[0].command_line, "-A") == ACCOUNT
    # Slurm's own record of where the jobs ran
    embed_report = _key_values((workdir / "results" / "embed_job.txt").read_text())
    assert embed_report["ATTEMPT"] == "2"
    assert "Partition=gpu" in (workdir / "results" / "embed_job.txt").read_text()
    assert "Partition=debug" in (workdir / "results" / "summary.txt").read_text()

    # missing data fails the same way every time: submitted once, not retried
    run = run_on_slurm(workdir, "--directory", str(workdir), "results/manifest.txt",
                       profiles=profiles, env=installed_profile)
    assert run.returncode != 0
    assert [s.rule for s in run.submissions].count("prepare_manifest") == 1, run.submissions
    assert "missing data: data/never-downloaded.csv" in (workdir / "logs" / "prepare_manifest.log").read_text()


def test_profile_install_names_unknown_partitions_and_refuses_to_overwrite(installed_profile, tmp_path):
    profile = tmp_path / "xdg-config" / "snakemake" / "slurm" / "config.yaml"
    before = profile.read_text()
    again = fmaudit_cli("profile", "install", "slurm", "--partition", "debug", "--gpu-partition", "gpu",
                        "--account", ACCOUNT, env=installed_profile)
    assert again.returncode == 2
    assert "a profile is already installed there (config.yaml); pass --force to replace it" in again.stderr
    wrong = fmaudit_cli("profile", "install", "slurm", "--partition", "cpu", "--gpu-partition", "gpus",
                        "--account", ACCOUNT, "--force", env=installed_profile)
    assert wrong.returncode == 2
    assert "partition 'cpu': unknown (sinfo lists the partitions debug, gpu)" in wrong.stderr
    assert "GPU partition 'gpus': unknown (sinfo lists the partitions debug, gpu)" in wrong.stderr
    assert profile.read_text() == before  # nothing written


@pytest.mark.skipif(not DEMO_SNAKEFILE.exists(), reason="demo workflow not available")
def test_demo_workflow_on_slurm_requests_gpus_for_embedding(run_on_slurm, installed_profile, tmp_path):
    import yaml

    workdir = tmp_path / "demo"
    shutil.copytree(REPO_ROOT, workdir, ignore=DEMO_COPY_IGNORE)
    # The demo's tile branch (manifests, validation, embeddings, probe shards, report): what the profile routes.
    # The OOD, prior-shift and cell branches run the same rule kinds and are left to tests/test_workflow.py, so
    # that this test stays within CI's time on a one-node cluster that polls every job.
    # one encoder: every rule kind still goes through Slurm, in CI's time
    demo = demo_tile_branches(yaml.safe_load((workdir / "config.yaml").read_text()), ["demo-vit-tiny"],
                              drop=("ood", "prior_shift", "cells"))
    (workdir / "tiles.yaml").write_text(yaml.safe_dump(demo))

    run = run_on_slurm(
        workdir,
        "--snakefile", str(workdir / "Snakefile"),
        "--configfile", str(workdir / "tiles.yaml"),
        "--directory", str(workdir),
        "report",
        timeout_s=1200,
        profiles=("slurm", SLURM_TEST_OVERRIDES),
        env=installed_profile,
    )  # fmt: skip

    assert run.returncode == 0, run.failure_message()
    embed_submissions = [s for s in run.submissions if s.rule == "embed"]
    assert embed_submissions, f"no embed job went to Slurm: {run.submissions}"
    for submission in embed_submissions:
        assert "--gpus=1" in submission.command_line.split(), submission.command_line
        assert _option(submission.command_line, "-p") == "gpu", submission.command_line
    others = [s for s in run.submissions if s.rule != "embed"]
    assert {s.rule for s in others} >= {"prepare_manifest", "probe_shard"}, run.submissions
    for submission in run.submissions:
        assert _option(submission.command_line, "-A") == ACCOUNT, submission.command_line
    for submission in others:
        assert _option(submission.command_line, "-p") == "debug", submission.command_line
        assert "--gpus" not in submission.command_line
    # local rules never go to Slurm: the split checks run on the login node, before any embedding job
    assert not {"validate", "download_dataset", "aggregate_probe", "report"} & {s.rule for s in run.submissions}
    assert (workdir / "results" / "demo" / "validation" / "preflight.tsv").is_file()
    embed_logs = list((workdir / ".snakemake" / "slurm_logs" / "rule_embed").rglob("*.log"))
    assert len(embed_logs) == len(embed_submissions)
    report_dir = workdir / "results" / "demo" / "report"
    assert report_dir.is_dir() and any(report_dir.iterdir())

    # a rerun whose embedding job fails on the cluster (weights that do not fit the encoder): its rule's log file
    # holds the full exception, and the earlier embeddings stay where they were
    import torch
    from safetensors.torch import save_file

    embeddings = workdir / "results" / "demo" / "embeddings" / "demo-vit-tiny"
    before = {p: p.read_bytes() for p in embeddings.rglob("*.npz")}
    save_file({"not_a_layer.weight": torch.zeros(3)}, str(workdir / "wrong.safetensors"))
    config = dict(demo, encoder_weights={"demo-vit-tiny": str(workdir / "wrong.safetensors")})
    (workdir / "wrong.yaml").write_text(yaml.safe_dump(config))
    failed = run_on_slurm(
        workdir,
        "--snakefile", str(workdir / "Snakefile"),
        "--configfile", str(workdir / "wrong.yaml"),
        "--directory", str(workdir),
        "report",
        timeout_s=600,
        profiles=("slurm", SLURM_TEST_OVERRIDES),
        env=installed_profile,
    )  # fmt: skip
    assert failed.returncode != 0
    # only the new key's embedding jobs ran, each tried three times (embed may fail for lack of resources); the
    # wrapper's record holds the first run's submissions too
    rerun = failed.submissions[len(run.submissions):]
    assert {s.rule for s in rerun} == {"embed"} and len(rerun) >= 3, rerun
    assert {p: p.read_bytes() for p in embeddings.rglob("*.npz")} == before
    logs = [p for p in (workdir / "results" / "demo" / "logs" / "embed" / "demo-vit-tiny").rglob("*.log")
            if "Traceback" in p.read_text()]
    assert logs, failed.failure_message()
    for log in logs:
        text = log.read_text()
        assert "the job failed: FmauditInputError: encoder 'demo-vit-tiny': the weights in" in text
        assert "do not fit the architecture" in text and "unexpected keys: not_a_layer.weight" in text
