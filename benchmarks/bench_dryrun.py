"""Benchmark: ``snakemake -n`` on every preset, against baselines measured in the same run.

Target: each preset's dry-run answers in under 15 s on 2 cores, and keeps doing so once the declared analyses
(cells, OOD, prior shift ...) get their rules: their jobs are batched so that even all.yaml stays a DAG of a
few thousand jobs (``fmaudit grid`` prints the counts).

What it times, each the median of ``--repeats`` runs of ``snakemake -n --quiet`` in a fresh copy of the
repository (so it touches no ``.snakemake/`` of the working tree):
- baselines: ``snakemake --version`` (interpreter and import startup) and the demo config's dry-run;
- every ``resources/presets/*.yaml`` with ``--replace-workflow-config`` (without it Snakemake merges the
  preset into config.yaml's demo tasks). A preset that names encoders or data sets the registries do not have
  yet runs against copies of the registries with placeholder entries for them (cloned from a real entry;
  dry-runs never read weights or data), and the row says how many;
- a stress config: the demo with as many placeholder encoders as it takes to plan as many jobs as all.yaml
  will once every declared analysis has rules (the total of its ``jobs`` column), i.e. the DAG it grows into;
- ``fmaudit grid --configfile <preset>`` (the command a user runs to count a grid; target <= 2 s and <= 300 MB
  on the CellPath preset's 304,920 runs, which it counts without building their table), median wall seconds
  and the peak RSS of the process, against the floor of importing what it must (``python -c "import
  fmaudit.io"``: the interpreter, numpy and pandas).

Run: ``.venv/bin/python benchmarks/bench_dryrun.py [--repeats 3] [--presets prism,all]``
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fmaudit import grid
from fmaudit.config import load_config

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
FMAUDIT = str(Path(sys.executable).with_name("fmaudit"))
TARGET_S = 15.0
GRID_TARGET_S, GRID_TARGET_MB = 2.0, 300.0


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):  # registries use anchors; written copies must stand alone
        return True


def copy_repo(dest: Path) -> Path:
    """The files git would ship (tracked and untracked-not-ignored), as in a fresh clone."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                         capture_output=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def timed(cmd: list[str], cwd: Path, repeats: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        out = proc.stdout + proc.stderr
    return statistics.median(times), out


def timed_with_rss(cmd: list[str], cwd: Path, repeats: int) -> tuple[float, float]:
    """Median wall seconds and the largest peak RSS (MiB) of ``repeats`` runs of ``cmd`` (with the copy's
    sources first on the path)."""
    env = dict(os.environ, PYTHONPATH=str(cwd / "src"))
    times, peaks = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        times.append(time.perf_counter() - t0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.read().decode()[-3000:]}")
        proc.stderr.close()
        peaks.append(usage.ru_maxrss / 1024)
    return statistics.median(times), max(peaks)


def planned_jobs(work: Path, configfile: Path) -> int:
    """Total of the job-stats table of one un-timed verbose dry-run."""
    proc = subprocess.run([SNAKEMAKE, "-n", "--replace-workflow-config", "--configfile", str(configfile)],
                          cwd=work, capture_output=True, text=True)
    m = re.search(r"^total\s+(\d+)\s*$", proc.stdout + proc.stderr, flags=re.M)
    return int(m.group(1)) if m else 0


def with_placeholders(config: dict, work: Path, tag: str, extra_encoders: list[str] = ()) -> tuple[dict, int]:
    """The config with registries of its own (added to the built-in ones) that hold a placeholder for every name
    the built-in registries lack."""
    builtin_encoders = yaml.safe_load((work / "resources" / "encoders.yaml").read_text())
    builtin_datasets = yaml.safe_load((work / "resources" / "datasets.yaml").read_text())
    enc_template = builtin_encoders.get("demo-vit-tiny") or next(iter(builtin_encoders.values()))
    ds_template = builtin_datasets.get("demo-tiles") or next(iter(builtin_datasets.values()))
    encoders = {name: copy.deepcopy(enc_template) for name in dict.fromkeys([*config["encoders"], *extra_encoders])
                if name not in builtin_encoders}
    datasets = {name: copy.deepcopy(ds_template) for name in config["datasets"] if name not in builtin_datasets}
    missing = len(encoders) + len(datasets)
    if not missing:
        return config, 0
    config = copy.deepcopy(config)
    for key, data in (("encoder_registry", encoders), ("dataset_registry", datasets)):
        if not data:
            continue
        path = work / "bench" / f"{tag}.{key}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.dump(data, Dumper=_NoAliases, sort_keys=False))
        config[key] = str(path)
    return config, missing


def write_config(config: dict, work: Path, tag: str) -> Path:
    path = work / "bench" / f"{tag}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.dump(config, Dumper=_NoAliases, sort_keys=False))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--presets", help="comma-separated preset names (default: all of resources/presets/)")
    ap.add_argument("--grid-only", action="store_true", help="only time `fmaudit grid`, not the dry-runs")
    args = ap.parse_args()
    presets = REPO / "resources" / "presets"
    names = args.presets.split(",") if args.presets else sorted(p.stem for p in presets.glob("*.yaml"))

    with tempfile.TemporaryDirectory(prefix="fmaudit-bench-") as tmp:
        work = copy_repo(Path(tmp))
        worst = 0.0
        if not args.grid_only:
            t_start, _ = timed([SNAKEMAKE, "--version"], work, args.repeats)
            t_demo, _ = timed([SNAKEMAKE, "-n", "--quiet", "--configfile", "config.yaml"], work, args.repeats)
            n_demo = planned_jobs(work, work / "config.yaml")
            print(f"baseline  snakemake --version        {t_start:6.2f} s")
            print(f"baseline  demo dry-run ({n_demo:4d} jobs)   {t_demo:6.2f} s")
            print()
            if t_start > 5:
                print("note: snakemake's own startup is slow here. Its slurm executor plugin runs "
                      "`scontrol show config`\n"
                      "      at import when sacct is installed, and waits ~9 s when no slurm controller answers; the\n"
                      "      'own s' column is the dry-run minus that startup.\n")
            header = (f"{'config':<10} {'planned':>7} {'declared':>8} {'dry-run s':>9} {'own s':>6} {'x demo':>7}"
                      f" {'x startup':>9}  {'< 15 s':<6} note")
            print(header)
            print("-" * len(header))
            worst = 0.0
            for name in names:
                raw = yaml.safe_load((presets / f"{name}.yaml").read_text())
                declared = int(grid.summarize(load_config(presets / f"{name}.yaml"))["jobs"].sum())
                config, missing = with_placeholders(raw, work, name)
                path = write_config(config, work, name)
                seconds, _ = timed([SNAKEMAKE, "-n", "--quiet", "--replace-workflow-config", "--configfile", str(path)],
                                   work, args.repeats)
                worst = max(worst, seconds)
                note = f"{missing} placeholder registry entries" if missing else ""
                verdict = "yes" if seconds < TARGET_S else "NO"
                print(f"{name:<10} {planned_jobs(work, path):7d} {declared:8d} {seconds:9.2f} {seconds - t_start:6.2f} "
                      f"{seconds / t_demo:7.2f} {seconds / t_start:9.2f}  {verdict:<6} {note}")

            # The DAG all.yaml grows into once every declared analysis has rules, as embed + probe jobs of the demo.
            target = int(grid.summarize(load_config(presets / "all.yaml"))["jobs"].sum())
            demo = yaml.safe_load((work / "config.yaml").read_text())
            per_encoder = len(demo["datasets"]) + len(demo["tasks"])
            clones = [f"stress-encoder-{i:04d}" for i in range(max(1, target // per_encoder))]
            demo["encoders"] = clones
            stress, _ = with_placeholders(demo, work, "stress")
            path = write_config(stress, work, "stress")
            seconds, _ = timed([SNAKEMAKE, "-n", "--quiet", "--replace-workflow-config", "--configfile", str(path)],
                               work, max(1, args.repeats - 1))
            worst = max(worst, seconds)
            print(f"{'stress':<10} {planned_jobs(work, path):7d} {target:8d} {seconds:9.2f} {seconds - t_start:6.2f} "
                  f"{seconds / t_demo:7.2f} {seconds / t_start:9.2f}  {'yes' if seconds < TARGET_S else 'NO':<6} "
                  f"demo with {len(clones)} encoders: as many jobs as all.yaml declares")
        print()
        floor_s, floor_mb = timed_with_rss([sys.executable, "-c", "import fmaudit.io"], work, args.repeats)
        print(f"fmaudit grid (target <= {GRID_TARGET_S:g} s and <= {GRID_TARGET_MB:g} MB); floor `python -c \"import "
              f"fmaudit.io\"` {floor_s:.2f} s, {floor_mb:.0f} MB")
        grid_ok = True
        for name in names:
            seconds, mb = timed_with_rss([FMAUDIT, "grid", "--configfile", str(presets / f"{name}.yaml")], work,
                                         args.repeats)
            runs = int(grid.summarize(load_config(presets / f"{name}.yaml"), totals=True).iloc[-1]["runs"])
            ok = seconds <= GRID_TARGET_S and mb <= GRID_TARGET_MB
            grid_ok &= ok or name != "cellpath"
            print(f"  {name:<10} {runs:8d} runs {seconds:6.2f} s {mb:6.0f} MB  {'yes' if ok else 'NO'}")
    print()
    print(f"planned = jobs Snakemake plans today; declared = jobs of every analysis in `fmaudit grid` (once all "
          f"rules exist). Worst {worst:.2f} s vs target {TARGET_S:.0f} s.")
    return 0 if worst < TARGET_S and grid_ok else 1


if __name__ == "__main__":
    sys.exit(main())
