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
    # the plugin's log of each submission: a group's under group_<group>_<rules>, a job's under rule_<rule>
    embed_logs = list((workdir / ".snakemake" / "slurm_logs").glob("*_embed*/**/*.log"))
    assert len(embed_logs) == len(embed_submissions)
    # the encoder's two embedding jobs (its two data sets) went to the cluster as one submission (group embed_<encoder>)
    assert sum(len(s.jobs) for s in embed_submissions) > len(embed_submissions) == 1
    report_dir = workdir / "results" / "demo" / "report"
    assert report_dir.is_dir() and any(report_dir.iterdir())

    # a rerun whose embedding job fails on the cluster (weights of the right keys and shapes whose values are NaN:
    # they pass the pre-flight, which stops a checkpoint that does not fit before any job): its rule's log file
    # holds the full exception, and the earlier embeddings stay where they were
    import torch
    from safetensors.torch import save_file

    from fmaudit.encoders import build_encoder

    embeddings = workdir / "results" / "demo" / "embeddings" / "demo-vit-tiny"
    before = {p: p.read_bytes() for p in embeddings.rglob("*.npz")}
    state = build_encoder("demo-vit-tiny").backbone.model.state_dict()
    save_file({k: torch.full_like(v, float("nan")) for k, v in state.items()}, str(workdir / "wrong.safetensors"))
    config = dict(demo, encoder_weights={"demo-vit-tiny": str(workdir / "wrong.safetensors")})
    (workdir / "wrong.yaml").write_text(yaml.safe_dump(config))
    failed = run_on_slurm(
        workdir,
        "--snakefile", str(workdir / "Snakefile"),
        "--configfile", str(workdir / "wrong.yaml"),
        "--directory", str(workdir),
        # no resubmission: NaN weights fail every attempt alike, and the embed rule's retries are the mini
        # workflow's test (test_installed_profile_routes_gpu_jobs_and_retries_only_resource_rules)
        "--preemptible-retries", "0",
        "report",
        timeout_s=600,
        profiles=("slurm", SLURM_TEST_OVERRIDES),
        env=installed_profile,
    )  # fmt: skip
    assert failed.returncode != 0
    # only the new key's embedding jobs ran (their submission, one group, went to Slurm once); the wrapper's record
    # holds the first run's submissions too
    rerun = failed.submissions[len(run.submissions):]
    assert {s.rule for s in rerun} == {"embed"} and len(rerun) >= 1, rerun
    assert {p: p.read_bytes() for p in embeddings.rglob("*.npz")} == before
    logs = [p for p in (workdir / "results" / "demo" / "logs" / "embed" / "demo-vit-tiny").rglob("*.log")
            if "Traceback" in p.read_text()]
    assert logs, failed.failure_message()
    for log in logs:
        text = log.read_text()
        assert "the job failed: FmauditInputError: encoder 'demo-vit-tiny' produced non-finite" in text
        assert "Traceback (most recent call last)" in text and "_check_finite" in text


def demo_cell_branch(cfg: dict, encoders: list[str], magnifications: list[float], protocols: list[str]) -> dict:
    """The demo config's cell branch only (its sections, taxonomies and shards), with ``encoders``,
    ``magnifications`` and ``protocols``: what the cluster test of grouped GPU jobs runs."""
    cfg = dict(cfg, encoders=encoders)
    for branch in ("ood", "prior_shift"):
        cfg.pop(branch, None)
    cfg["datasets"] = ["demo-xenium"]
    cfg["tasks"] = {t: spec for t, spec in cfg["tasks"].items() if spec["datasets"] == ["demo-xenium"]}
    cfg["dataset_params"] = {k: v for k, v in cfg.get("dataset_params", {}).items() if k == "demo-xenium"}
    cfg["cells"] = dict(cfg["cells"], magnifications=magnifications,
                        protocols={p: spec for p, spec in cfg["cells"]["protocols"].items() if p in protocols})
    return cfg


@pytest.mark.skipif(not DEMO_SNAKEFILE.exists(), reason="demo workflow not available")
def test_grouped_feature_jobs_submit_once_per_group_resume_after_a_kill_and_match_a_local_run(
        run_on_slurm, installed_profile, tmp_path):
    """The demo's cell branch (one encoder, four sections at 10x and 20x, one protocol) on Slurm through the
    installed profile: the encoder's four feature jobs (one per section, both magnifications in the job, the
    encoder loaded once per job process) go as one submission, its shards as another; a run killed while that
    submission runs resumes without redoing the sections it finished; the result table equals a local run's,
    where every job runs on its own."""
    import pandas as pd
    import yaml

    cells = demo_cell_branch(yaml.safe_load((REPO_ROOT / "config.yaml").read_text()), ["demo-vit-tiny"], [10, 20],
                             ["IS"])
    target = "results/demo/aggregate/cell_runs.parquet"
    workdir = tmp_path / "slurm"
    shutil.copytree(REPO_ROOT, workdir, ignore=DEMO_COPY_IGNORE)
    (workdir / "cells.yaml").write_text(yaml.safe_dump(cells))
    args = (target, "--snakefile", str(workdir / "Snakefile"), "--configfile", str(workdir / "cells.yaml"),
            "--directory", str(workdir))
    profiles = ("slurm", SLURM_TEST_OVERRIDES)
    features = workdir / "results" / "demo" / "cells" / "features" / "demo-vit-tiny"
    sections = [s for organ in cells["cells"]["sections"].values() for s in organ]

    def finished_sections() -> dict[str, list[int]]:
        """Sections whose feature job finished (both magnifications written), with their folders' mtimes."""
        out = {}
        for section in sections:
            metas = [next(iter(features.glob(f"*/{m}x/{section}/meta.json")), None) for m in (10, 20)]
            if all(metas):
                out[section] = [m.stat().st_mtime_ns for m in metas]
        return out

    logs = workdir / "results" / "demo" / "logs" / "cell_features" / "demo-vit-tiny"
    snapshot: dict[str, list[int]] = {}

    def next_job_started() -> bool:
        """A section is finished and a later job of the submission has started (its log exists): the node ran
        the jobs one after another, so the finished ones are complete for Snakemake too."""
        snapshot.clear()
        snapshot.update(finished_sections())
        started = {p.stem for p in logs.glob("*/10x/*.log")}
        return bool(snapshot) and bool(started - set(snapshot))

    # 1. killed while the feature submission runs, after its first section and before its last
    running = run_on_slurm.start(workdir, *args, profiles=profiles, env=installed_profile)
    started = running.wait_for(next_job_started, timeout_s=900)
    done = dict(snapshot)
    first = running.kill()
    assert started, first.output[-6000:]
    assert 1 <= len(done) < len(sections), f"the kill came too late to leave a section undone: {sorted(done)}"
    feature_submissions = [s for s in first.submissions if s.rule == "cell_features"]
    assert len(feature_submissions) == 1 and len(feature_submissions[0].jobs) == len(sections)
    unfinished = set(sections) - set(finished_sections())

    # 2. the rerun resumes: the finished sections' jobs are not submitted again and their folders are untouched.
    # A killed Snakemake leaves its lock: a user unlocks first (README, "A stale lock")
    unlock = run_on_slurm(workdir, *args, "--unlock", profiles=profiles, env=installed_profile)
    assert unlock.returncode == 0, unlock.failure_message()
    run = run_on_slurm(workdir, *args, timeout_s=1200, profiles=profiles, env=installed_profile)
    assert run.returncode == 0, run.failure_message()
    resumed = run.submissions[len(first.submissions):]
    resumed_sections = {job["section"] for s in resumed for job in s.jobs if job.rule == "cell_features"}
    assert not resumed_sections & set(done) and resumed_sections >= unfinished, (sorted(done), resumed)
    assert {s: finished_sections()[s] for s in done} == done
    # fewer submissions than jobs: a group of an encoder's feature jobs, a group of its shards
    jobs = [job for s in resumed for job in s.jobs]
    assert len(resumed) < len(jobs)
    shard_submissions = [s for s in resumed if s.rule == "cell_shard"]
    assert len(shard_submissions) == 1 and len(shard_submissions[0].jobs) == 2  # one protocol x 2 magnifications
    for submission in resumed:
        if submission.rule == "cell_features":
            assert "--gpus=1" in submission.command_line.split()
            assert _option(submission.command_line, "-p") == "gpu", submission.command_line
    # each feature job loaded the encoder once in its process, for both magnifications: one `loaded encoder` line
    # over its two logs (none for a section whose chunks were all kept), and each log names the process
    for section in resumed_sections:
        texts = [next(iter(logs.glob(f"*/{m}x/{section}.log"))).read_text() for m in (10, 20)]
        assert sum(t.count("loaded encoder demo-vit-tiny") for t in texts) <= 1, texts
        pids = [re.findall(r"encoder loads in process (\d+): demo-vit-tiny (\d+) time", t) for t in texts]
        assert pids[0] == pids[1] and len(pids[0]) == 1, pids
        assert int(pids[0][0][1]) == sum(t.count("loaded encoder demo-vit-tiny") for t in texts)

    # 3. the same table as a local run, every job on its own: a copy of the finished study without its features,
    # shards and aggregate (the prepared sections and their checks are kept: they are not what grouping changes)
    local = tmp_path / "local"
    shutil.copytree(workdir, local, ignore=shutil.ignore_patterns("slurm_logs"))
    for produced in ("cells/features", "shards", "aggregate"):
        shutil.rmtree(local / "results" / "demo" / produced)
    done_locally = subprocess.run(
        [sys.executable, "-m", "snakemake", target, "--cores", "2", "--configfile", "cells.yaml"],
        cwd=local, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert "prepare_cell_section" not in done_locally.stdout + done_locally.stderr
    assert done_locally.returncode == 0, done_locally.stdout[-4000:] + done_locally.stderr[-4000:]
    grouped, alone = pd.read_parquet(workdir / target), pd.read_parquet(local / target)
    assert len(grouped) > 0
    pd.testing.assert_frame_equal(grouped, alone)
