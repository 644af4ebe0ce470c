"""Fixtures for the tests that run workflows on a real one-node Slurm cluster.

`slurm_cluster` brings the cluster up once per session with slurm_up.sh and takes it down again
when the last test session using it ends, if a test session started it. `run_on_slurm` runs
Snakemake through profiles/slurm plus the test overrides in profiles/slurm-test (or through the
profiles a test names, e.g. one installed by `fmaudit profile install`), with an `sbatch` wrapper
first on PATH that records every submission, so a test can check what was asked of Slurm.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CLUSTER_DIR = Path(__file__).resolve().parent
REPO_ROOT = CLUSTER_DIR.parents[1]
SLURM_TEST_OVERRIDES = REPO_ROOT / "profiles" / "slurm-test"
SLURM_PROFILES = (REPO_ROOT / "profiles" / "slurm", SLURM_TEST_OVERRIDES)

# Several pytest sessions on one machine share the cluster: each holds a shared lock while it uses
# it, bring-up happens under the exclusive lock, and the last session out takes the cluster down
# if a test session started it (a cluster brought up by hand is left running).
LOCK_PATH = Path(tempfile.gettempdir()) / "fmaudit-slurm-tests.lock"
STARTED_BY_TESTS = Path(tempfile.gettempdir()) / "fmaudit-slurm-tests.started"


def _ci_is_set() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _controller_answers() -> bool:
    try:
        ping = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=15, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "is UP" in ping.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """Start the test cluster (or check the running one); yields slurm_up.sh's status line."""
    # Daemons live in /usr/sbin, which is not on every user's PATH.
    sbin_path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    if shutil.which("slurmctld", path=sbin_path) is None:
        if _ci_is_set():
            pytest.fail(
                "CI is set but Slurm is not installed (no slurmctld on PATH): .ci/run must "
                "install slurm-wlm and munge before the tests"
            )
        pytest.skip("Slurm is not installed (no slurmctld); apt-get install slurm-wlm munge")
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _controller_answers():
            STARTED_BY_TESTS.touch()
        up = subprocess.run(
            ["bash", str(CLUSTER_DIR / "slurm_up.sh")],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        fcntl.flock(lock, fcntl.LOCK_SH)
        if up.returncode != 0:
            pytest.fail(
                f"slurm_up.sh exited with {up.returncode}:\n{up.stdout}\n{up.stderr}",
                pytrace=False,
            )
        yield up.stdout.strip()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another session is still using the cluster
        if STARTED_BY_TESTS.exists():
            STARTED_BY_TESTS.unlink()
            # --purge also removes the generated slurm.conf: with a config but no controller, every later
            # Snakemake start stalls ~10 s while the Slurm plugin's scontrol waits for an answer
            subprocess.run(
                ["bash", str(CLUSTER_DIR / "slurm_down.sh"), "--purge"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )


@dataclass(frozen=True)
class TargetJob:
    """One Snakemake job of a submission: its rule and wildcards (the plugin's `--target-jobs RULE:K=V,...`)."""

    rule: str
    wildcards: tuple[tuple[str, str], ...]

    def __getitem__(self, name: str) -> str:
        return dict(self.wildcards)[name]


@dataclass
class SlurmSubmission:
    """One sbatch call seen by the wrapper: the Slurm job id and the command line."""

    job_id: str
    command_line: str

    @property
    def jobs(self) -> list[TargetJob]:
        """The Snakemake jobs this submission runs: one, or the jobs of a group (`--target-jobs` of the
        Snakemake command the plugin wraps)."""
        tokens = self.command_line.split()
        if "--target-jobs" not in tokens:
            return []
        out = []
        for token in tokens[tokens.index("--target-jobs") + 1 :]:
            if token.startswith("--"):
                break
            rule, _, wildcards = token.strip("'\"").partition(":")
            pairs = tuple(tuple(kv.split("=", 1)) for kv in wildcards.split(",") if "=" in kv)
            out.append(TargetJob(rule, pairs))
        return out

    @property
    def rule(self) -> str | None:
        """The rule of the submission's jobs (a group's jobs are of one rule here), else the rule name of the
        plugin's `--comment rule_<name>[_wildcards_...]`."""
        rules = {job.rule for job in self.jobs}
        if len(rules) == 1:
            return rules.pop()
        for token in self.command_line.split():
            if token.startswith("rule_"):
                return token[len("rule_") :].split("_wildcards_")[0]
        return None


@dataclass
class SlurmRun:
    returncode: int
    output: str
    submissions: list[SlurmSubmission]

    def failure_message(self) -> str:
        return f"snakemake exited with {self.returncode}; last output:\n{self.output[-6000:]}"


SBATCH_WRAPPER = """#!/bin/sh
# Records each submission (job id, then the arguments) and passes it on to the real sbatch.
out=$({real_sbatch} "$@")
rc=$?
printf '%s\\t%s\\n' "$out" "$*" >> {log}
printf '%s\\n' "$out"
exit $rc
"""


class RunningSnakemake:
    """A Snakemake run on the cluster, in the background (`run_on_slurm.start`): wait for something it writes,
    then kill it the way a lost login session or an impatient user does."""

    def __init__(self, process: subprocess.Popen, output: Path, read_submissions):
        self.process = process
        self.output = output  # Snakemake's output so far (a file: a pipe nobody reads would stall it)
        self._read_submissions = read_submissions

    def wait_for(self, condition, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Poll ``condition()`` until it holds (True), the run ends or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return True
            if self.process.poll() is not None:
                return bool(condition())
            time.sleep(poll_s)
        return False

    def kill(self) -> SlurmRun:
        """SIGKILL Snakemake (its process group: the run and nothing else) and cancel every job it submitted."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        output = self.output.read_text()
        submissions = self._read_submissions()
        job_ids = [s.job_id.split(";")[0] for s in submissions if s.job_id]
        if job_ids:
            subprocess.run(["scancel", *job_ids], capture_output=True, timeout=30, check=False)
        return SlurmRun(self.process.returncode, output, submissions)


@pytest.fixture
def run_on_slurm(slurm_cluster, tmp_path):
    """Return `run(workdir, *snakemake_args, timeout_s=..., profiles=..., env=...) -> SlurmRun`, with
    `run.start(workdir, *snakemake_args, profiles=..., env=...) -> RunningSnakemake` for a run to interrupt.

    `profiles` are the --profile arguments in order (names or folders; default: the template plus the
    test overrides); `env` adds environment variables (e.g. XDG_CONFIG_HOME, where Snakemake looks for
    named profiles). Snakemake ignores SIGTERM while it has jobs out, so the call runs under
    `timeout -k 10`; jobs left behind by a timed-out run are cancelled. The wrapper's record of the
    submissions spans every run of the test.
    """
    real_sbatch = shutil.which("sbatch")
    assert real_sbatch, "sbatch missing although slurm_up.sh succeeded"
    wrapper_dir = tmp_path / "sbatch-wrapper"
    wrapper_dir.mkdir()
    submissions_log = wrapper_dir / "submissions.tsv"
    wrapper = wrapper_dir / "sbatch"
    wrapper.write_text(SBATCH_WRAPPER.format(real_sbatch=real_sbatch, log=submissions_log))
    wrapper.chmod(0o755)
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    base_env["PATH"] = f"{wrapper_dir}{os.pathsep}{base_env.get('PATH', '')}"

    def read_submissions() -> list[SlurmSubmission]:
        if not submissions_log.exists():
            return []
        rows = submissions_log.read_text().splitlines()
        return [SlurmSubmission(*row.split("\t", 1)) for row in rows if "\t" in row]

    def run(workdir: Path, *snakemake_args: str, timeout_s: int = 240, profiles=SLURM_PROFILES,
            env: dict[str, str] | None = None) -> SlurmRun:
        profile_args = [arg for profile in profiles for arg in ("--profile", str(profile))]
        command = [
            "timeout", "-k", "10", str(timeout_s),
            sys.executable, "-m", "snakemake", *profile_args, *snakemake_args,
        ]  # fmt: skip
        completed = subprocess.run(
            command,
            cwd=workdir,
            env={**base_env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s + 60,
            check=False,
        )
        submissions = read_submissions()
        if completed.returncode != 0:
            job_ids = [s.job_id.split(";")[0] for s in submissions if s.job_id]
            if job_ids:
                subprocess.run(["scancel", *job_ids], capture_output=True, timeout=30, check=False)
        return SlurmRun(completed.returncode, completed.stdout, submissions)

    def start(workdir: Path, *snakemake_args: str, profiles=SLURM_PROFILES,
              env: dict[str, str] | None = None) -> RunningSnakemake:
        profile_args = [arg for profile in profiles for arg in ("--profile", str(profile))]
        output = wrapper_dir / f"snakemake-{len(list(wrapper_dir.glob('snakemake-*.log')))}.log"
        with open(output, "w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "snakemake", *profile_args, *snakemake_args],
                cwd=workdir,
                env={**base_env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # its own process group, killed as one
            )
        return RunningSnakemake(process, output, read_submissions)

    run.start = start
    return run
