"""Dry-run of the CellPath preset (seed 002): does ``snakemake -n`` plan every cell feature and shard job of the
304,920-run grid within 10 s and 1 GiB on 2 cores?

Runs, in fresh child processes of this one, ``snakemake --version`` (the baseline: the cost of starting
Snakemake at all) and ``snakemake -n --configfile resources/presets/cellpath.yaml`` (the plan), each
``--repeats`` times, and prints the median wall times, their ratio, the jobs planned per rule, and the peak
RSS of the dry-run (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``, the largest child so far: the
dry-runs run after the baseline, and a dry-run's RSS is far above ``--version``'s). The working directory is a
copy of the repository (git ls-files), so nothing of a local results/ folder is read.

    .venv/bin/python benchmarks/bench_cellpath_dryrun.py [--repeats 3] [--preset resources/presets/cellpath.yaml]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from workflow_utils import copy_repo, planned_jobs  # noqa: E402

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="resources/presets/cellpath.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_repo(Path(tmp))
        base = [timed([SNAKEMAKE, "--version"], work)[0] for _ in range(args.repeats)]
        rss_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        runs, out = [], ""
        for _ in range(args.repeats):
            t, out = timed([SNAKEMAKE, "-n", "--configfile", args.preset], work)
            runs.append(t)
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    jobs = planned_jobs(out)
    base_s, dry_s = statistics.median(base), statistics.median(runs)
    print(f"preset: {args.preset}")
    print(f"jobs planned: {sum(jobs.values())} " + ", ".join(f"{k}={v}" for k, v in jobs.items()))
    print(f"snakemake --version: median {base_s:.2f} s over {args.repeats} ({', '.join(f'{t:.2f}' for t in base)})")
    print(f"snakemake -n       : median {dry_s:.2f} s over {args.repeats} ({', '.join(f'{t:.2f}' for t in runs)})")
    print(f"ratio dry-run / --version: {dry_s / base_s:.2f}x; target: dry-run <= 10 s")
    print(f"peak RSS of the dry-run: {peak_kib / 1024:.0f} MiB (--version's children peaked at {rss_before / 1024:.0f} MiB);"
          " target <= 1024 MiB")


if __name__ == "__main__":
    main()
