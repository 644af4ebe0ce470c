"""Helpers of the workflow tests: a fresh copy of the repository and a real Snakemake run in it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def copy_repo(dest: Path) -> Path:
    """Copy the files git would ship (tracked and untracked-not-ignored) into ``dest``: a fresh clone's tree."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                         capture_output=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = REPO / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def snakemake(workdir: Path, *args: str, timeout: int = 1200, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def planned_jobs(dry_run_output: str) -> dict[str, int]:
    """Rule -> job count from the job-stats table of ``snakemake -n``."""
    counts: dict[str, int] = {}
    lines = dry_run_output.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("job") and "count" in line:
            for row in lines[i + 2:]:
                parts = row.split()
                if len(parts) != 2 or not parts[1].isdigit():
                    break
                if parts[0] != "total":
                    counts[parts[0]] = int(parts[1])
            break
    return counts


def demo_tile_branches(cfg: dict, encoders: list[str], drop: tuple[str, ...] = ("cells",)) -> dict:
    """The demo config with only ``encoders``, without the branches in ``drop`` (always the cell branch: its
    data set demo-xenium and the tasks on it go too). Fewer encoders then re-merge the kept encoders' results
    and rerun nothing else."""
    cfg["encoders"] = encoders
    for branch in {"cells", *drop}:
        cfg.pop(branch, None)
    cfg["datasets"] = [d for d in cfg["datasets"] if d != "demo-xenium"]
    cfg["tasks"] = {t: spec for t, spec in cfg["tasks"].items() if "demo-xenium" not in spec["datasets"]}
    cfg.get("dataset_params", {}).pop("demo-xenium", None)
    return cfg

