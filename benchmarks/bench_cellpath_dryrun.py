"""Dry-run of the CellPath preset: does ``snakemake -n`` plan every cell feature and shard job of the
304,920-run grid within 10 s and 1 GiB on 2 cores?

Runs, in fresh child processes of this one, ``snakemake --version`` (the baseline: the cost of starting
Snakemake at all) and ``snakemake -n --configfile resources/presets/cellpath.yaml`` (the plan), each
``--repeats`` times, and prints the median wall times, their ratio, the jobs planned per rule, and the peak
RSS of the dry-run (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``, the largest child so far: the
dry-runs run after the baseline, and a dry-run's RSS is far above ``--version``'s). The working directory is a
copy of the repository (git ls-files), so nothing of a local results/ folder is read.

The floor: Snakemake's own cost for the same plan. A generated workflow with the same rules and job counts as the
preset's cell branch (prepare per section, one validation, a feature job per (encoder, section) with a directory
output and a log per magnification and the same directives: input, outputs, logs, benchmark, params, threads,
three resources, group, conda, script; a merge per (encoder, magnification); a shard per (encoder, magnification,
protocol); the merges), but
every path, param and resource static: no fmaudit code, no input function, no config. Its ``snakemake -n`` is
timed in the same loop (interleaved with the preset's), as is ``snakemake -n -q`` of both (the plan without the
per-job listing) and the preset's ``snakemake -n --profile profiles/slurm`` (the cluster's plan: job groups and
each job's sized request). What the preset takes above the floor is what fmaudit's Snakefile and helpers cost.

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

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from workflow_utils import copy_repo, planned_jobs

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


FLOOR_SNAKEFILE = """
ENC = [f"e{{i:03d}}" for i in range({encoders})]
SEC = [f"s{{i:03d}}" for i in range({sections})]
MAG = [f"{{i}}" for i in range({magnifications})]
PROT = [f"p{{i}}" for i in range({protocols})]
R = "results"

rule all:
    input:
        f"{{R}}/report.html",

rule prepare:
    output:
        f"{{R}}/cells/sections/{{{{section}}}}.parquet",
    log:
        f"{{R}}/logs/prepare/{{{{section}}}}.log",
    benchmark:
        f"{{R}}/benchmarks/prepare/{{{{section}}}}.tsv"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "envs/x.yaml"
    script:
        "scripts/x.py"

rule validate:
    input:
        expand(f"{{R}}/cells/sections/{{{{section}}}}.parquet", section=SEC),
    output:
        f"{{R}}/cells/validated.json",
    log:
        f"{{R}}/logs/validate.log",
    conda:
        "envs/x.yaml"
    script:
        "scripts/x.py"

rule features:
    input:
        manifest=f"{{R}}/cells/sections/{{{{section}}}}.parquet",
        validated=f"{{R}}/cells/validated.json",
    output:
        [directory(f"{{R}}/cells/features/{{{{encoder}}}}/key/{{m}}x/{{{{section}}}}") for m in MAG],
    log:
        [f"{{R}}/logs/features/{{{{encoder}}}}/key/{{m}}x/{{{{section}}}}.log" for m in MAG],
    benchmark:
        f"{{R}}/benchmarks/features/{{{{encoder}}}}/key/{{{{section}}}}.tsv"
    params:
        encoder="name",
        weights="",
        magnifications=MAG,
        batch_size=64,
        chunk_size=256,
    threads: 1
    resources:
        gpu=1,
        mem_mb=16000,
        runtime=240,
    group:
        "features_{{encoder}}"
    conda:
        "envs/x.yaml"
    script:
        "scripts/x.py"

rule feature_set:
    input:
        expand(f"{{R}}/cells/features/{{{{{{{{encoder}}}}}}}}/key/{{{{{{{{magnification}}}}}}}}x/{{{{section}}}}",
               section=SEC),
    output:
        f"{{R}}/cells/features/{{{{encoder}}}}/key/{{{{magnification}}}}x.json",
    log:
        f"{{R}}/logs/feature_set/{{{{encoder}}}}/key/{{{{magnification}}}}x.log",
    conda:
        "envs/x.yaml"
    script:
        "scripts/x.py"

rule shard:
    input:
        features=f"{{R}}/cells/features/{{{{encoder}}}}/key/{{{{magnification}}}}x.json",
        validated=f"{{R}}/cells/validated.json",
    output:
        f"{{R}}/shards/cells/{{{{protocol}}}}/{{{{encoder}}}}/{{{{magnification}}}}x.parquet",
    log:
        f"{{R}}/logs/shard/{{{{protocol}}}}/{{{{encoder}}}}/{{{{magnification}}}}x.log",
    benchmark:
        f"{{R}}/benchmarks/shard/{{{{protocol}}}}/{{{{encoder}}}}/{{{{magnification}}}}x.tsv"
    params:
        cells="settings",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    conda:
        "envs/x.yaml"
    script:
        "scripts/x.py"

rule aggregate:
    input:
        expand(f"{{R}}/shards/cells/{{{{protocol}}}}/{{{{encoder}}}}/{{{{magnification}}}}x.parquet", protocol=PROT,
               encoder=ENC, magnification=MAG),
    output:
        f"{{R}}/cells/runs.parquet",
    log:
        f"{{R}}/logs/aggregate.log",
    conda:
        "envs/x.yaml"
    script:
        "scripts/x.py"

rule report:
    input:
        f"{{R}}/cells/runs.parquet",
    output:
        f"{{R}}/report.html",
    log:
        f"{{R}}/logs/report.log",
    conda:
        "envs/x.yaml"
    script:
        "scripts/x.py"
"""


def write_floor(dest: Path, jobs: dict[str, int], magnifications: int) -> tuple[Path, int]:
    """The floor workflow for the preset's planned cell jobs; returns its folder and its job count."""
    sections = jobs["prepare_cell_section"]
    merges = jobs["cell_feature_set"]
    encoders = merges // magnifications
    if merges % magnifications or jobs["cell_shard"] % merges or jobs["cell_features"] != encoders * sections:
        raise SystemExit(f"the preset's cell jobs do not have the expected shape: {jobs}")
    protocols = jobs["cell_shard"] // merges
    dest.mkdir(parents=True)
    (dest / "Snakefile").write_text(FLOOR_SNAKEFILE.format(
        encoders=encoders, sections=sections, magnifications=magnifications, protocols=protocols))
    (dest / "envs").mkdir()
    (dest / "envs" / "x.yaml").write_text("channels: [conda-forge]\ndependencies: [python=3.11]\n")
    (dest / "scripts").mkdir()
    (dest / "scripts" / "x.py").write_text("")
    total = sections + 1 + encoders * sections + merges + merges * protocols + 3
    return dest, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="resources/presets/cellpath.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_repo(Path(tmp))
        base = [timed([SNAKEMAKE, "--version"], work)[0] for _ in range(args.repeats)]
        rss_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        # The first dry-run in a fresh copy also creates .snakemake/ and its source cache: printed, not in the median.
        first_s, out = timed([SNAKEMAKE, "-n", "--configfile", args.preset], work)
        jobs = planned_jobs(out)
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        magnifications = len(yaml.safe_load((work / args.preset).read_text())["cells"]["magnifications"])
        floor_dir, floor_jobs = write_floor(Path(tmp) / "floor", jobs, magnifications)
        floor_out = timed([SNAKEMAKE, "-n"], floor_dir)[1]  # warm-up
        if sum(planned_jobs(floor_out).values()) != floor_jobs:
            raise SystemExit(f"the floor workflow planned {planned_jobs(floor_out)}, expected {floor_jobs} jobs")
        times: dict[str, list[float]] = {"preset": [], "floor": [], "preset -q": [], "floor -q": [], "slurm": []}
        slurm = [SNAKEMAKE, "-n", "--profile", "profiles/slurm", "--configfile", args.preset]
        for _ in range(args.repeats):  # interleaved
            times["preset"].append(timed([SNAKEMAKE, "-n", "--configfile", args.preset], work)[0])
            times["floor"].append(timed([SNAKEMAKE, "-n"], floor_dir)[0])
            times["preset -q"].append(timed([SNAKEMAKE, "-n", "-q", "--configfile", args.preset], work)[0])
            times["floor -q"].append(timed([SNAKEMAKE, "-n", "-q"], floor_dir)[0])
            if (work / "profiles" / "slurm").is_dir():
                times["slurm"].append(timed(slurm, work)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    base_s, dry_s = statistics.median(base), med["preset"]
    print(f"preset: {args.preset}")
    print(f"jobs planned: {sum(jobs.values())} " + ", ".join(f"{k}={v}" for k, v in jobs.items()))
    print(f"snakemake --version: median {base_s:.2f} s over {args.repeats} ({', '.join(f'{t:.2f}' for t in base)})")
    print(f"snakemake -n       : median {dry_s:.2f} s over {args.repeats} "
          f"({', '.join(f'{t:.2f}' for t in times['preset'])})")
    print(f"first snakemake -n in the fresh copy (creates .snakemake/): {first_s:.2f} s")
    print(f"ratio dry-run / --version: {dry_s / base_s:.2f}x; target: dry-run <= 10 s")
    print(f"peak RSS of the dry-run: {peak_kib / 1024:.0f} MiB "
          f"(--version's children peaked at {rss_before / 1024:.0f} MiB);"
          " target <= 1024 MiB")
    print(f"floor (the same {floor_jobs} jobs, static, no fmaudit code): snakemake -n median {med['floor']:.2f} s "
          f"({', '.join(f'{t:.2f}' for t in times['floor'])}); -n -q: preset {med['preset -q']:.2f} s, floor "
          f"{med['floor -q']:.2f} s")
    if times["slurm"]:
        print(f"snakemake -n --profile profiles/slurm (the cluster's plan: groups, sized requests): median "
              f"{statistics.median(times['slurm']):.2f} s ({', '.join(f'{t:.2f}' for t in times['slurm'])})")
    print(f"fmaudit's share of the dry-run: {med['preset'] - med['floor']:.2f} s (preset - floor); Snakemake's own: "
          f"{med['floor'] - base_s:.2f} s (floor - --version) for {floor_jobs} jobs, "
          f"{1000 * (med['floor'] - base_s) / floor_jobs:.2f} ms per job")


if __name__ == "__main__":
    main()
